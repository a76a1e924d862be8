#!/usr/bin/env python3
"""Every parallel layout of `python -m tardelli.train` against one process, on one device kind.

    PYTHONPATH=python python benchmarks/gpu/layout_parity.py --device cuda   # the GPU stage
    PYTHONPATH=python python benchmarks/gpu/layout_parity.py --device cpu    # the same, on CPUs

Trains a small GPT for a few AdamW steps on synthetic data, first in one process (the
reference: the whole global batch, by gradient accumulation), then under each layout started by
`python -m tardelli.launch --nproc N`: dp 2, ZeRO-1/2/3, tp 2 + sp, pp 2 with 1f1b, interleaved
(vpp 2) and zb, tp 2 x pp 2, cp 2 (ring and all-to-all), and dp 2 in bf16. On a GPU every rank trains on cuda:{local rank %
GPUs}, so on a one-GPU machine 2 and 4 ranks share it and their collectives go through host
memory (include/tardelli/distributed/host_staged.h; Note [Ranks on GPUs] in src/train/trainer.cpp).

Each layout sees the same global batch, so its per-step losses equal the reference's up to the
order of the fp32 sums: relative 1e-5 in fp32 (as the CPU tests assert). bf16 rounds every
activation to 8 significant bits, and the layouts round different partial sums, so two runs
can differ by a few bf16 ulps of the loss (2^-8 = 0.4% each): relative 1e-2.

Output: one JSON line per layout (max relative loss difference, tolerance, pass), then a
summary line; exit status 1 when a layout fails or does not run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODEL = ["--synthetic-data", "--vocab-size", "256", "--layers", "4", "--d-model", "64",
         "--heads", "4", "--seq-len", "32", "--global-batch-size", "8", "--steps", "5",
         "--warmup-steps", "1", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
         "--log-interval", "1", "--ddp-bucket-mb", "0.05"]

# (name, ranks, flags, dtype)
LAYOUTS = [
    ("dp2", 2, ["--micro-batch-size", "4"], "fp32"),
    ("dp2_zero1", 2, ["--micro-batch-size", "4", "--zero", "1"], "fp32"),
    ("dp2_zero2", 2, ["--micro-batch-size", "4", "--zero", "2"], "fp32"),
    ("dp2_zero3", 2, ["--micro-batch-size", "4", "--zero", "3"], "fp32"),
    ("tp2_sp", 2, ["--micro-batch-size", "8", "--tp", "2", "--sequence-parallel"], "fp32"),
    ("pp2_1f1b", 2, ["--micro-batch-size", "2", "--pp", "2", "--schedule", "1f1b"], "fp32"),
    ("pp2_interleaved", 2, ["--micro-batch-size", "2", "--pp", "2", "--vpp", "2",
                            "--schedule", "interleaved"], "fp32"),
    ("pp2_zb", 2, ["--micro-batch-size", "2", "--pp", "2", "--schedule", "zb"], "fp32"),
    ("tp2_pp2", 4, ["--micro-batch-size", "2", "--tp", "2", "--pp", "2"], "fp32"),
    ("cp2_ring", 2, ["--micro-batch-size", "8", "--cp", "2", "--cp-comm", "ring"], "fp32"),
    ("cp2_a2a", 2, ["--micro-batch-size", "8", "--cp", "2", "--cp-comm", "a2a"], "fp32"),
    ("dp2_bf16", 2, ["--micro-batch-size", "4"], "bf16"),
]
RTOL = {"fp32": 1e-5, "bf16": 1e-2}


def train(nproc, flags, dtype, device, metrics, timeout):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1",
               TD_COMM_TIMEOUT_S="60")
    prefix = [sys.executable]
    if nproc > 1:
        prefix += ["-m", "tardelli.launch", "--nproc", str(nproc), "--timeout", "60"]
    cmd = prefix + ["-m", "tardelli.train", *MODEL, "--device", device, "--dtype", dtype,
                    *flags, "--metrics-file", str(metrics)]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        return None, (p.stdout + p.stderr)[-1500:]
    return [json.loads(line)["loss"] for line in open(metrics)], ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda | cpu")
    ap.add_argument("--only", default="", help="comma-separated layout names (default: all)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        refs = {}
        for name, nproc, flags, dtype in LAYOUTS:
            if only and name not in only:
                continue
            if dtype not in refs:
                refs[dtype], err = train(1, ["--micro-batch-size", "8"], dtype, args.device,
                                         Path(d) / f"ref_{dtype}.jsonl", args.timeout)
                if refs[dtype] is None:
                    print(json.dumps({"layout": f"reference_{dtype}", "ok": False, "error": err}))
                    failures += 1
                    continue
            ref = refs[dtype]
            if ref is None:
                continue
            got, err = train(nproc, flags, dtype, args.device, Path(d) / f"{name}.jsonl",
                             args.timeout)
            rec = {"layout": name, "ranks": nproc, "device": args.device, "dtype": dtype,
                   "flags": " ".join(flags)}
            if got is None or len(got) != len(ref):
                rec.update(ok=False, error=err or f"{len(got or [])} losses, want {len(ref)}")
            else:
                rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
                rec.update(max_rel_diff=rel, rtol=RTOL[dtype], ok=rel <= RTOL[dtype],
                           losses=[round(x, 6) for x in got], reference=[round(x, 6) for x in ref])
            failures += not rec["ok"]
            print(json.dumps(rec), flush=True)
    print(json.dumps({"summary": "layout_parity", "device": args.device, "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
