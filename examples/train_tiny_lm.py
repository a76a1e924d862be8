#!/usr/bin/env python3
"""Train a tiny character-level transformer with Tardelli's Python API, top to bottom.

    PYTHONPATH=python /usr/bin/python3 examples/train_tiny_lm.py            # about a minute
    PYTHONPATH=python /usr/bin/python3 examples/train_tiny_lm.py --steps 50 # a quick look

The model is written in functional style, as in llm.c: every parameter is a plain tensor that
requires grad, every layer is a few calls into td.nn.functional, and the optimizer is the fused
AdamW kernel (td.ops.adamw_step) applied to lists of tensors. The corpus is a short story in
examples/data/tiny_corpus.txt (about 4 KB); the last 10% is held out. The script prints the
loss as it trains, the final loss against the corpus's unigram entropy (the best loss of a model
that ignores context), and a greedy sample. With so little text the model mostly memorizes: the
training loss falls far below the unigram entropy while the held-out loss stays near it. It
exits non-zero if the training loss did not beat the unigram entropy.
"""

import argparse
import math
import time
from pathlib import Path

import numpy as np

import tardelli as td

F = td.nn.functional

CORPUS = Path(__file__).resolve().parent / "data" / "tiny_corpus.txt"


# ---------------------------------------------------------------------------------------------
# Data: characters -> int64 ids; batches are random windows of block_size + 1 characters.


def load_corpus(path):
    text = path.read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.int64)
    return text, chars, ids


def unigram_entropy(ids, vocab_size):
    """Entropy (nats) of the character frequencies: the loss of the best context-free model."""
    p = np.bincount(ids, minlength=vocab_size).astype(np.float64) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def get_batch(ids, batch_size, block_size, rng):
    starts = rng.integers(0, len(ids) - block_size - 1, size=batch_size)
    x = np.stack([ids[s : s + block_size] for s in starts])
    y = np.stack([ids[s + 1 : s + block_size + 1] for s in starts])
    return td.from_numpy(x), td.from_numpy(y)


# ---------------------------------------------------------------------------------------------
# The model: GPT-2 style, pre-norm, tied input/output embeddings.


def init_params(vocab_size, block_size, d_model, n_layers, seed):
    td.manual_seed(seed)
    std = 0.02
    proj_std = std / math.sqrt(2 * n_layers)  # residual projections: GPT-2's scaled init

    def normal(*shape, s=std):
        return (td.randn(*shape) * s).requires_grad_()

    def ones(n):
        return td.ones(n).requires_grad_()

    def zeros(*shape):
        return td.zeros(*shape).requires_grad_()

    params = {"wte": normal(vocab_size, d_model), "wpe": normal(block_size, d_model)}
    for i in range(n_layers):
        params.update(
            {
                f"h{i}.ln1.w": ones(d_model),
                f"h{i}.ln1.b": zeros(d_model),
                f"h{i}.attn.w": normal(3 * d_model, d_model),
                f"h{i}.attn.b": zeros(3 * d_model),
                f"h{i}.proj.w": normal(d_model, d_model, s=proj_std),
                f"h{i}.proj.b": zeros(d_model),
                f"h{i}.ln2.w": ones(d_model),
                f"h{i}.ln2.b": zeros(d_model),
                f"h{i}.fc.w": normal(4 * d_model, d_model),
                f"h{i}.fc.b": zeros(4 * d_model),
                f"h{i}.fc_proj.w": normal(d_model, 4 * d_model, s=proj_std),
                f"h{i}.fc_proj.b": zeros(d_model),
            }
        )
    params["lnf.w"] = ones(d_model)
    params["lnf.b"] = zeros(d_model)
    return params


def forward(params, idx, n_layers, n_heads):
    """idx: int64 [B, T] -> logits [B, T, vocab]."""
    B, T = idx.shape
    D = params["wte"].shape[1]
    hd = D // n_heads
    pos = td.arange(T)
    x = F.embedding(idx, params["wte"]) + F.embedding(pos, params["wpe"])
    for i in range(n_layers):
        p = lambda name: params[f"h{i}.{name}"]  # noqa: E731
        # Attention block.
        h = F.layer_norm(x, (D,), p("ln1.w"), p("ln1.b"))
        qkv = F.linear(h, p("attn.w"), p("attn.b"))  # [B, T, 3D]
        q, k, v = (t.reshape(B, T, n_heads, hd).transpose(1, 2) for t in qkv.split(D, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, hd]
        y = y.transpose(1, 2).reshape(B, T, D)
        x = x + F.linear(y, p("proj.w"), p("proj.b"))
        # MLP block.
        h = F.layer_norm(x, (D,), p("ln2.w"), p("ln2.b"))
        h = F.gelu(F.linear(h, p("fc.w"), p("fc.b")))
        x = x + F.linear(h, p("fc_proj.w"), p("fc_proj.b"))
    x = F.layer_norm(x, (D,), params["lnf.w"], params["lnf.b"])
    return F.linear(x, params["wte"])  # tied output embedding


def loss_fn(params, x, y, n_layers, n_heads):
    logits = forward(params, x, n_layers, n_heads)
    B, T, V = logits.shape
    return F.cross_entropy(logits.reshape(B * T, V), y.reshape(B * T))


# ---------------------------------------------------------------------------------------------
# Optimizer: AdamW through the fused multi-tensor kernel. Weight decay on matrices only.


class AdamW:
    def __init__(self, params, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8):
        self.groups = [
            [p for p in params if p.dim() >= 2],  # decayed
            [p for p in params if p.dim() < 2],  # gains and biases: not decayed
        ]
        self.decay = [weight_decay, 0.0]
        # (exp_avg, exp_avg_sq) per group, fp32 like the parameters.
        self.state = [([td.zeros_like(p) for p in g], [td.zeros_like(p) for p in g])
                      for g in self.groups]
        self.lr, self.betas, self.eps, self.t = lr, betas, eps, 0

    def step(self, lr):
        self.t += 1
        for group, wd, (m, v) in zip(self.groups, self.decay, self.state):
            grads = [p.grad for p in group]
            td.ops.adamw_step(
                group, grads, m, v, lr=lr, beta1=self.betas[0], beta2=self.betas[1],
                eps=self.eps, weight_decay=wd, step=self.t,
            )

    def zero_grad(self):
        for group in self.groups:
            for p in group:
                p.grad = None


def lr_at(step, steps, base_lr, warmup):
    """Linear warm-up, then cosine decay to 10% of the base rate."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return base_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


# ---------------------------------------------------------------------------------------------


def evaluate(params, ids, args, n_batches=8):
    """Mean loss over fixed random windows of `ids` (the same windows every call)."""
    rng = np.random.default_rng(1234)
    total = 0.0
    with td.no_grad():
        for _ in range(n_batches):
            x, y = get_batch(ids, args.batch_size, args.block_size, rng)
            total += loss_fn(params, x, y, args.n_layers, args.n_heads).item()
    return total / n_batches


def greedy_sample(params, prompt, chars, args, n_chars=160):
    stoi = {c: i for i, c in enumerate(chars)}
    ids = [stoi[c] for c in prompt]
    with td.no_grad():
        for _ in range(n_chars):
            ctx = np.array([ids[-args.block_size :]], dtype=np.int64)
            logits = forward(params, td.from_numpy(ctx), args.n_layers, args.n_heads)
            last = logits.numpy()[0, -1]
            ids.append(int(np.argmax(last)))
    return "".join(chars[i] for i in ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=96)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--print-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    text, chars, ids = load_corpus(CORPUS)
    vocab = len(chars)
    h_unigram = unigram_entropy(ids, vocab)
    n_train = int(0.9 * len(ids))
    train_ids, heldout_ids = ids[:n_train], ids[n_train:]
    print(f"corpus: {len(text)} characters, vocabulary {vocab}, "
          f"unigram entropy {h_unigram:.3f} nats ({h_unigram / math.log(2):.2f} bits/char)")

    params = init_params(vocab, args.block_size, args.d_model, args.n_layers, args.seed)
    n_params = sum(p.numel() for p in params.values())
    print(f"model: {args.n_layers} layers, d_model {args.d_model}, {args.n_heads} heads, "
          f"context {args.block_size}, {n_params:,} parameters")
    opt = AdamW(list(params.values()), lr=args.lr, weight_decay=args.weight_decay)

    print(f"step     0  train loss {evaluate(params, train_ids, args):.4f}  "
          f"(uniform guess: {math.log(vocab):.3f})")
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    warmup = max(1, min(30, args.steps // 10))
    for step in range(args.steps):
        x, y = get_batch(train_ids, args.batch_size, args.block_size, rng)
        loss = loss_fn(params, x, y, args.n_layers, args.n_heads)
        loss.backward()
        opt.step(lr_at(step, args.steps, args.lr, warmup))
        opt.zero_grad()
        if (step + 1) % args.print_every == 0 or step + 1 == args.steps:
            elapsed = time.perf_counter() - t0
            tok_s = (step + 1) * args.batch_size * args.block_size / elapsed
            print(f"step {step + 1:5d}  train loss {loss.item():.4f}  ({tok_s:,.0f} tokens/s)")
    train_time = time.perf_counter() - t0

    final = evaluate(params, train_ids, args)
    heldout = evaluate(params, heldout_ids, args)
    print(f"final train loss {final:.4f} nats vs unigram entropy {h_unigram:.4f} nats "
          f"({final / h_unigram:.0%} of it) after {args.steps} steps in {train_time:.1f} s; "
          f"held-out loss {heldout:.4f}")
    print("greedy sample:")
    print("  " + greedy_sample(params, "The ", chars, args).replace("\n", "\n  "))
    if not final < h_unigram:
        print("FAILED: the training loss did not beat the unigram entropy")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
