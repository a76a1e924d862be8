#!/usr/bin/env python3
"""What activation recomputation costs and saves on one GPT training step (docs/memory.md).

    PYTHONPATH=python .venv/bin/python benchmarks/recompute_step.py
    PYTHONPATH=python .venv/bin/python benchmarks/recompute_step.py --layers 8 --d-model 256

One forward + backward per step for each --recompute mode, interleaved mode by mode within
each round so machine noise hits every mode alike; per mode: the median step time over --steps
rounds after one warm-up, the allocator's step peak (td.memory_stats, gradients allocated by the
warm-up) and the bytes held after the forward (the activations kept for backward). The formula
column is Note [Recompute modes]'s per-block bytes x layers x tokens. One JSON line per mode.
"""
import argparse
import json
import statistics
import time

import tardelli as td


def per_token(cfg, mode):
    s, d, ff, H = 4 if cfg.dtype == td.float32 else 2, cfg.d_model, cfg.ffn_hidden_size(), \
        cfg.n_head
    hd = d // H
    A, K = H * hd, cfg.kv_heads() * hd
    if mode == "full":
        return s * d
    gpt2 = cfg.arch == "gpt2"
    b = s * (10 * d + ff) + 4 * (4 + H) if gpt2 else s * (6 * d + 3 * A + 3 * K + 2 * ff) + \
        4 * (2 + H)
    return b + (s * (ff if gpt2 else 2 * ff) if mode == "none" else 0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="gpt2")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    cfg = td.models.GPTConfig(arch=a.arch, vocab_size=4096, block_size=a.seq_len,
                              n_layer=a.layers, n_head=a.heads, d_model=a.d_model, seed=1)
    modes = ["none", "selective", "full"]
    models = {m: td.models.GPT(cfg).set_recompute(m) for m in modes}
    g = td.Generator(2)
    x = td.randint(0, 4096, (a.batch, a.seq_len), generator=g)
    y = td.randint(0, 4096, (a.batch, a.seq_len), generator=g)
    times = {m: [] for m in modes}
    peak, held = {}, {}
    for r in range(a.steps + 1):
        for m in modes:
            model = models[m]
            td.reset_peak_memory_stats()
            base = td.memory_stats()["current_bytes"]
            t0 = time.perf_counter()
            loss = model(x, y)
            kept = td.memory_stats()["current_bytes"] - base
            loss.backward()
            dt = time.perf_counter() - t0
            if r > 0:  # the first round allocates every .grad
                times[m].append(dt)
                peak[m] = td.memory_stats()["peak_bytes"] - base
                held[m] = kept
    tokens = a.batch * a.seq_len
    for m in modes:
        print(json.dumps({"mode": m, "arch": a.arch, "layers": a.layers, "d_model": a.d_model,
                          "tokens": tokens, "step_s": statistics.median(times[m]),
                          "peak_bytes": peak[m], "held_after_forward_bytes": held[m],
                          "formula_block_bytes": per_token(cfg, m) * a.layers * tokens}))


if __name__ == "__main__":
    main()
