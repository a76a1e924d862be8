"""Tokenize text into a Megatron-format dataset (PREFIX.bin + PREFIX.idx).

    python -m tardelli.data.preprocess --input corpus.jsonl --output-prefix out/corpus \\
        --vocab-size 8192                      # train a byte-level BPE on the input, or
        --tokenizer-dir gpt2/                  # use vocab.json + merges.txt from a directory

Inputs: .jsonl / .json files hold one JSON object per line with the text under --json-key;
any other file is plain text whose documents are separated by lines equal (after stripping) to
--doc-separator (default: an empty line, i.e. blank-line-separated paragraphs; fortune files
use "%"). Plain text is read as UTF-8, undecodable bytes becoming U+FFFD. Empty documents are
skipped. Each document becomes one sequence (plus the end-of-document token unless
--no-append-eod). The tokenizer is saved to PREFIX.tokenizer/ so later steps can decode.

Prints a summary line and a one-line JSON summary; bad input exits with status 2 and a message.
"""
import argparse
import json
import os
import sys
import time

_BATCH = 512  # documents per encode_batch call


class InputError(Exception):
    """Bad input: reported as one message and exit status 2."""


def _is_jsonl(path):
    return path.endswith((".jsonl", ".json", ".jsonl.txt"))


def iter_documents(paths, json_key="text", separator=""):
    """Yields the text of every document of every input, in order."""
    for path in paths:
        if _is_jsonl(path):
            yield from _jsonl_documents(path, json_key)
        else:
            yield from _text_documents(path, separator)


def _jsonl_documents(path, key):
    with open(path, encoding="utf-8", errors="strict") as f:
        lineno = 0
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{lineno}: invalid JSON: {e.msg} "
                                     f"(column {e.colno})") from None
                if not isinstance(obj, dict) or key not in obj:
                    raise InputError(f"{path}:{lineno}: no key {key!r} in this JSON line "
                                     f"(use --json-key to choose the text field)")
                text = obj[key]
                if not isinstance(text, str):
                    raise InputError(f"{path}:{lineno}: {key!r} is a {type(text).__name__}, "
                                     "not a string")
                if text.strip():
                    yield text
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: line {lineno + 1} is not valid UTF-8 ({e.reason})") from None


def _text_documents(path, separator):
    sep = separator.strip()
    lines = []
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        for line in f:
            if line.strip() == sep:
                doc = "".join(lines)
                lines = []
                if doc.strip():
                    yield doc[:-1] if doc.endswith("\n") else doc
            else:
                lines.append(line)
    doc = "".join(lines)
    if doc.strip():
        yield doc[:-1] if doc.endswith("\n") else doc


def _progress(total_bytes):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", file=sys.stderr,
                disable=not sys.stderr.isatty())


def _batches(it, n):
    batch = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def run(args):
    for p in args.input:
        if not os.path.isfile(p):
            raise InputError(f"input file not found: {p}")
    if (args.tokenizer_dir is None) == (args.vocab_size is None):
        raise InputError("give exactly one of --tokenizer-dir DIR and --vocab-size N")
    if args.workers is not None:
        if args.workers < 1:
            raise InputError(f"--workers must be >= 1, got {args.workers}")
        os.environ["RAYON_NUM_THREADS"] = str(args.workers)  # before tokenizers' thread pool
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    out_dir = os.path.dirname(os.path.abspath(args.output_prefix))
    if not os.path.isdir(out_dir):
        raise InputError(f"output directory does not exist: {out_dir}")

    from .. import data as tdd  # the C++ extension; imported late so --help is instant
    from .tokenizer import Tokenizer

    t0 = time.time()
    docs = lambda: iter_documents(args.input, args.json_key, args.doc_separator)  # noqa: E731
    if args.tokenizer_dir is not None:
        if not os.path.isfile(os.path.join(args.tokenizer_dir, "vocab.json")):
            raise InputError(f"--tokenizer-dir {args.tokenizer_dir}: no vocab.json there")
        tok = Tokenizer.load(args.tokenizer_dir)
    else:
        print(f"preprocess: training a byte-level BPE with vocab size {args.vocab_size}",
              file=sys.stderr)
        tok = Tokenizer.train(docs(), args.vocab_size)
    eod = tok.eod_id
    if args.append_eod and eod is None:
        raise InputError("the tokenizer has no <|endoftext|> token; pass --no-append-eod")
    t_tok = time.time()

    import numpy as np

    code = tdd.best_dtype_code(tok.vocab_size)
    builder = tdd.IndexedDatasetBuilder(args.output_prefix, code)
    n_docs = n_tokens = 0
    bar = _progress(sum(os.path.getsize(p) for p in args.input))
    for batch in _batches(docs(), _BATCH):
        for ids in tok.encode_batch(batch):
            if args.append_eod:
                ids.append(eod)
            builder.add_document(np.asarray(ids, dtype=np.int64))
            n_tokens += len(ids)
        n_docs += len(batch)
        if bar is not None:
            bar.update(sum(len(d.encode("utf-8", "replace")) for d in batch))
        elif n_docs % (_BATCH * 200) < _BATCH:
            print(f"preprocess: {n_docs} documents, {n_tokens} tokens", file=sys.stderr)
    if bar is not None:
        bar.close()
    if n_docs == 0:
        raise InputError("the inputs hold no (non-empty) documents")
    builder.finalize()
    tok.save(args.output_prefix + ".tokenizer")
    seconds = time.time() - t0
    summary = {
        "documents": n_docs, "tokens": n_tokens, "seconds": round(seconds, 3),
        "tokenizer_seconds": round(t_tok - t0, 3), "vocab_size": tok.vocab_size,
        "dtype": tdd.dtype_code_name(code), "eod_id": eod if args.append_eod else None,
        "output_prefix": args.output_prefix,
    }
    print(f"preprocess: {n_docs} documents, {n_tokens} tokens, {seconds:.2f} s "
          f"({n_tokens / max(seconds, 1e-9):,.0f} tokens/s) -> {args.output_prefix}.bin/.idx",
          file=sys.stderr)
    print(json.dumps(summary))
    return summary


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tardelli.data.preprocess",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--input", nargs="+", required=True, metavar="FILE")
    p.add_argument("--output-prefix", required=True, metavar="P",
                   help="writes P.bin, P.idx and P.tokenizer/")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tokenizer-dir", metavar="DIR", help="load vocab.json + merges.txt")
    g.add_argument("--vocab-size", type=int, metavar="N", help="train a BPE on the input")
    p.add_argument("--json-key", default="text", help="text field of JSONL inputs")
    p.add_argument("--doc-separator", default="", metavar="SEP",
                   help="plain text: document separator line (default: a blank line)")
    p.add_argument("--append-eod", dest="append_eod", action="store_true", default=True,
                   help="end every document with <|endoftext|> (default)")
    p.add_argument("--no-append-eod", dest="append_eod", action="store_false")
    p.add_argument("--workers", type=int, default=None, help="tokenizer threads (default: all)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except InputError as e:
        print(f"preprocess: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"preprocess: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # td errors (e.g. the builder cannot write) carry their own message
        if type(e).__name__ == "TardelliError":
            print(f"preprocess: error: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
