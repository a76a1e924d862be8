"""python -m tardelli.generate: sample text from a training checkpoint.

    python -m tardelli.generate --checkpoint runs/demo --prompt "The meaning of life"

--checkpoint is a step directory or a --save root (its latest checkpoint is used). The
tokenizer is the one saved in the checkpoint (vocab.json + merges.txt) unless --tokenizer-dir
names another. Sampling is the model's KV-cached generate(): temperature, then top-k.
"""
import argparse
import os
import sys


def resolve_checkpoint(path):
    """A step directory: `path` itself when it holds meta.json, else the latest under it."""
    import tardelli as td
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    latest = td.checkpoint.find_latest(path) if os.path.isdir(path) else None
    if latest is None:
        raise FileNotFoundError(f"--checkpoint {path}: no checkpoint there (expected a step "
                                "directory with meta.json or a --save root with one)")
    return latest


def load_tokenizer(step_dir, tokenizer_dir=None):
    from .data.tokenizer import Tokenizer
    d = tokenizer_dir or step_dir
    vocab, merges = os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt")
    if not (os.path.isfile(vocab) and os.path.isfile(merges)):
        raise FileNotFoundError(f"no tokenizer (vocab.json, merges.txt) in {d}; the model was "
                                "trained without one (synthetic data?): pass --tokenizer-dir")
    return Tokenizer.from_files(vocab, merges)


def generate_text(model, tok, prompt, max_new_tokens, temperature, top_k, num_samples, seed):
    import tardelli as td
    ids = tok.encode(prompt) if prompt else [tok.eod_id]
    limit = model.config.block_size
    if len(ids) > limit:
        ids = ids[-limit:]
    idx = td.tensor([ids] * num_samples, dtype=td.int64)
    gen = td.Generator(seed)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k,
                         generator=gen)
    texts = []
    for row in out.tolist():
        new = row[len(ids):]
        if tok.eod_id in new:  # a document ended: stop there
            new = new[:new.index(tok.eod_id)]
        texts.append(prompt + tok.decode(new))
    return texts


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tardelli.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt", default="")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-dir", default=None)
    a = p.parse_args(argv)
    if a.max_new_tokens < 0 or a.num_samples < 1:
        p.error("--max-new-tokens must be >= 0 and --num-samples >= 1")
    from .train import state
    try:
        step_dir = resolve_checkpoint(a.checkpoint)
        tok = load_tokenizer(step_dir, a.tokenizer_dir)
        model, _ = state.load_model(step_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"python -m tardelli.generate: error: {e}", file=sys.stderr)
        return 2
    for i, text in enumerate(generate_text(model, tok, a.prompt, a.max_new_tokens,
                                           a.temperature, a.top_k, a.num_samples, a.seed)):
        print(f"--- sample {i + 1} ---\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
