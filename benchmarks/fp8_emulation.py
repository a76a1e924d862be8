#!/usr/bin/env python3
"""What the CPU emulation of FP8 (ops/fp8.h, docs/fp8.md) costs on one GPT training step: it is
there for correctness (an exact reference of an FP8 GEMM), not speed.

    PYTHONPATH=python .venv/bin/python benchmarks/fp8_emulation.py
    PYTHONPATH=python .venv/bin/python benchmarks/fp8_emulation.py --layers 4 --d-model 256

One forward + backward (+ the step's amax commit) per round for each mode, interleaved mode by
mode within each round so machine noise hits every mode alike: bf16 (no FP8), --fp8 hybrid,
--fp8 e4m3, and hybrid under the adaptive policy's monitoring (the statistics: counts and
reference GEMMs). Per mode the median step time over --steps rounds after one warm-up, and the
ratio to bf16. One JSON line per mode, then one with the CPU's name.
"""
import argparse
import json
import os
import platform
import statistics
import time

import tardelli as td


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    cfg = td.models.GPTConfig(vocab_size=4096, block_size=a.seq_len, n_layer=a.layers,
                              n_head=a.heads, d_model=a.d_model, dtype="bf16", seed=1)
    modes = ["bf16", "hybrid", "e4m3", "hybrid+adaptive-stats"]
    models = {}
    for m in modes:
        model = td.models.GPT(cfg)
        if m != "bf16":
            model._cpp.set_fp8(16, 0.0, "e4m3" if m == "e4m3" else "hybrid")
        if m.endswith("stats"):
            model._cpp.linear_precisions = ["fp8"] * len(model._cpp.linear_names())
            model._cpp.precision_monitor = True
        model.train()
        models[m] = model
    g = td.Generator(2)
    x = td.randint(0, 4096, (a.batch, a.seq_len), generator=g)
    y = td.randint(0, 4096, (a.batch, a.seq_len), generator=g)
    times = {m: [] for m in modes}
    for r in range(a.steps + 1):
        for m in modes:
            model = models[m]
            t0 = time.perf_counter()
            model(x, y).backward()
            td._C.parallel.precision_step(model._cpp, None, None)  # commit the amaxes
            dt = time.perf_counter() - t0
            if r > 0:
                times[m].append(dt)
    base = statistics.median(times["bf16"])
    for m in modes:
        t = statistics.median(times[m])
        print(json.dumps({"mode": m, "layers": a.layers, "d_model": a.d_model,
                          "tokens": a.batch * a.seq_len, "step_s": round(t, 4),
                          "vs_bf16": round(t / base, 2)}))
    print(json.dumps({"cpu": cpu_name(), "cpu_count": os.cpu_count(),
                      "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}))


if __name__ == "__main__":
    main()
