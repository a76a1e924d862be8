"""Byte-level BPE tokenizer (GPT-2 style) on top of HuggingFace `tokenizers`.

    tok = Tokenizer.train(texts, vocab_size=4096)       # or Tokenizer.from_files(vocab, merges)
    ids = tok.encode("hello world") + [tok.eod_id]
    tok.save("out/tokenizer")                            # vocab.json + merges.txt
    Tokenizer.load("out/tokenizer").decode(ids)          # 'hello world<|endoftext|>'

Byte-level BPE is lossless: decode(encode(s)) == s for every str s. The files are the GPT-2
format, so a HuggingFace gpt2 directory loads with Tokenizer.load(dir).
"""
import json
import os

EOD_TOKEN = "<|endoftext|>"
_SPECIALS_FILE = "special_tokens.json"  # our own extra file; GPT-2 directories lack it


def _hf():
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("tardelli.data.Tokenizer needs the `tokenizers` package "
                          "(pip install tokenizers)") from e
    return tokenizers


def _byte_level(model):
    tk = _hf()
    tok = tk.Tokenizer(model)
    # GPT-2's setup: no prefix space (so decoding is exact), its split regex, byte-level decode.
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    return tok


class Tokenizer:
    """A byte-level BPE tokenizer; see the module docstring."""

    def __init__(self, hf_tokenizer, special_tokens=(EOD_TOKEN,)):
        self._tok = hf_tokenizer
        vocab = hf_tokenizer.get_vocab(with_added_tokens=True)
        # Special tokens present in the vocabulary are matched whole in text and never split.
        self.special_tokens = [s for s in special_tokens if s in vocab]
        if self.special_tokens:
            self._tok.add_special_tokens(self.special_tokens)

    # ---- construction ----
    @classmethod
    def train(cls, texts, vocab_size, special_tokens=(EOD_TOKEN,), show_progress=False):
        """Learns merges from an iterable of str until the vocabulary has vocab_size entries
        (256 byte symbols + special tokens + merges; fewer if the corpus runs out of pairs)."""
        tk = _hf()
        special_tokens = list(special_tokens)
        if vocab_size < 256 + len(special_tokens):
            raise ValueError(f"Tokenizer.train: vocab_size {vocab_size} is smaller than the 256 "
                             f"byte symbols plus {len(special_tokens)} special tokens")
        tok = _byte_level(tk.models.BPE())
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=special_tokens, show_progress=show_progress,
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok, special_tokens)

    @classmethod
    def from_files(cls, vocab_json, merges_txt, special_tokens=(EOD_TOKEN,)):
        """GPT-2 style files (vocab.json: token -> id, merges.txt: one merge per line)."""
        for p in (vocab_json, merges_txt):
            if not os.path.isfile(p):
                raise FileNotFoundError(f"Tokenizer.from_files: no such file: {p}")
        tk = _hf()
        return cls(_byte_level(tk.models.BPE.from_file(str(vocab_json), str(merges_txt))),
                   special_tokens)

    @classmethod
    def load(cls, directory):
        """A directory with vocab.json and merges.txt (ours from save(), or HF gpt2's)."""
        specials = [EOD_TOKEN]
        sp = os.path.join(directory, _SPECIALS_FILE)
        if os.path.isfile(sp):
            with open(sp, encoding="utf-8") as f:
                specials = json.load(f)
        return cls.from_files(os.path.join(directory, "vocab.json"),
                              os.path.join(directory, "merges.txt"), specials)

    def save(self, directory):
        """Writes vocab.json, merges.txt (GPT-2 format) and special_tokens.json."""
        os.makedirs(directory, exist_ok=True)
        self._tok.model.save(str(directory))
        with open(os.path.join(directory, _SPECIALS_FILE), "w", encoding="utf-8") as f:
            json.dump(self.special_tokens, f)

    # ---- use ----
    def encode(self, text):
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        """encode() of each text, in parallel threads (RAYON_NUM_THREADS sets how many)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids):
        return self._tok.decode(list(ids), skip_special_tokens=False)

    @property
    def vocab_size(self):
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eod_id(self):
        """The id of <|endoftext|> (None when the vocabulary lacks it)."""
        return self._tok.token_to_id(EOD_TOKEN)

    def token_to_id(self, token):
        return self._tok.token_to_id(token)

    def __repr__(self):
        return f"Tokenizer(vocab_size={self.vocab_size}, eod_id={self.eod_id})"
