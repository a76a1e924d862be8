#!/usr/bin/env python3
"""The Quick start demo: train a GPT on a real English corpus, then evaluate and sample.

    bash scripts/demo.sh                      # installs, builds, then runs this (~6 minutes)
    PYTHONPATH=python .venv/bin/python examples/train_fortunes.py --steps 50   # a quick look

1. Corpus: the fortune cookies of Debian's `fortunes` package (/usr/share/games/fortunes:
   about 15,000 quotations, jokes and aphorisms, 2.5 MB of English; the ASCII-art files are
   left out). Each fortune is one document; they are shuffled once (seed 0) so the held-out
   split is a sample of every topic.
2. Preprocess (once): train a byte-level BPE tokenizer on the corpus and write a
   Megatron-format dataset (runs/fortunes/data/fortunes.{bin,idx}) with
   `python -m tardelli.data.preprocess`.
3. Train with `tardelli.train` (the library behind `python -m tardelli.train`), configured by
   examples/configs/fortunes.toml: a GPT-2 style model of a few million parameters for about
   five minutes on 2 CPU cores, evaluating on the held-out split, saving a checkpoint and a
   loss curve to runs/fortunes/ckpt.
4. Report: the validation loss next to the unigram entropy of the tokens (the loss of the best
   model that ignores context), and a few samples from the trained model.
Exits non-zero if the validation loss did not end well below the unigram entropy.
"""
import argparse
import glob
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import tardelli as td
from tardelli.generate import generate_text, load_tokenizer
from tardelli.train import parse_config, train
from tardelli.train import state

ROOT = Path(__file__).resolve().parents[1]
CORPUS_DIR = "/usr/share/games/fortunes"
RUN = ROOT / "runs" / "fortunes"
PREFIX = RUN / "data" / "fortunes"
CONFIG = ROOT / "examples" / "configs" / "fortunes.toml"
PROMPTS = ["The meaning of life is", "A computer", "Q: What do you call"]


def corpus_files():
    skip = {"art", "ascii-art"}
    files = sorted(f for f in glob.glob(os.path.join(CORPUS_DIR, "*"))
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8"))
                   and os.path.basename(f) not in skip)
    if not files:
        sys.exit(f"demo: no corpus in {CORPUS_DIR}: install Debian's `fortunes` package "
                 "(scripts/setup.sh does)")
    return files


def preprocess():
    """One text file of every fortune in a seeded random order (the files are by topic, and the
    train/valid split takes contiguous documents: shuffling makes the validation set a sample
    of the whole corpus rather than its last topics), then the Megatron-format dataset."""
    if PREFIX.with_suffix(".idx").exists():
        return
    PREFIX.parent.mkdir(parents=True, exist_ok=True)
    fortunes = []
    for f in corpus_files():
        text = Path(f).read_text(encoding="utf-8", errors="replace")
        fortunes += [d.strip("\n") for d in text.split("\n%\n") if d.strip() not in ("", "%")]
    np.random.default_rng(0).shuffle(fortunes)
    corpus = PREFIX.parent / "fortunes.txt"
    corpus.write_text("\n%\n".join(fortunes) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "tardelli.data.preprocess", "--input", str(corpus),
                    "--output-prefix", str(PREFIX), "--vocab-size", "4096",
                    "--doc-separator", "%"], check=True)


def unigram_entropy(prefix):
    """Entropy (nats/token) of the token frequencies over the whole dataset."""
    ds = td.data.IndexedDataset(str(prefix))
    counts = np.zeros(1, dtype=np.int64)
    for i in range(len(ds)):
        c = np.bincount(ds[i].numpy())
        if len(c) > len(counts):
            counts = np.pad(counts, (0, len(c) - len(counts)))
        counts[:len(c)] += c
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="override the config's steps")
    args, rest = ap.parse_known_args()

    preprocess()
    argv = ["--config", str(CONFIG), "--data", str(PREFIX), "--save", str(RUN / "ckpt"),
            "--metrics-file", str(RUN / "metrics.jsonl")]
    if args.steps is not None:
        argv += ["--steps", str(args.steps), "--warmup-steps", str(min(args.steps // 10, 100)),
                 "--eval-interval", str(max(args.steps // 4, 1))]
    cfg, _ = parse_config(argv + rest)
    summary = train(cfg)

    entropy = unigram_entropy(PREFIX)
    val = summary.get("val_loss", math.nan)
    print(f"\nvalidation loss {val:.3f} nats/token vs unigram entropy {entropy:.3f} "
          f"nats/token ({summary['tokens_per_s']:,.0f} tokens/s, MFU "
          f"{100 * summary['mfu']:.1f}%)")

    step_dir = td.checkpoint.find_latest(str(RUN / "ckpt"))
    model, _ = state.load_model(step_dir)
    tok = load_tokenizer(step_dir)
    for prompt in PROMPTS:
        text = generate_text(model, tok, prompt, max_new_tokens=60, temperature=0.8, top_k=40,
                             num_samples=1, seed=1)[0]
        print(f"\n>>> {text}")
    print(f"\ncheckpoint: {step_dir}; loss curve: {summary.get('loss_curve', '-')}")
    if not val < 0.8 * entropy:
        sys.exit(f"demo: validation loss {val:.3f} is not well below the unigram entropy "
                 f"{entropy:.3f}")


if __name__ == "__main__":
    main()
