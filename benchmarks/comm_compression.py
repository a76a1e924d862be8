#!/usr/bin/env python3
"""What the data-parallel gradient reduction sends, and when compression or a two-level
reduction pays (issue 26; docs/distributed.md "Gradient compression").

    PYTHONPATH=python .venv/bin/python benchmarks/comm_compression.py

1. Measured here: `python -m tardelli.train` at dp 2 and 4 (a 2-layer gpt2, d_model 256, seq
   64, synthetic tokens) for each reduction: flat, --hierarchical-reduce (2 simulated nodes at
   dp 4), PowerSGD rank 4, top-k 1%; per step the bytes this rank handed to the reduction's
   communicators (metrics dp_comm_bytes; cross_node_bytes for the two-level one) and the median
   step time.
2. Exact for GPT-2 124M (its parameter shapes): the elements one rank sends per step with
   PowerSGD rank 4 against the uncompressed all-reduce (target <= 5%).
3. On paper, an alpha-beta model (latency alpha per message, link bandwidth beta) of one step's
   reduction for GPT-2 124M at 64 and 512 GPUs (8 per node, NVLink inside nodes) over 100 and
   400 Gb/s links between nodes, against the step's compute at 40% MFU of an H100 (989 TFLOP/s
   bf16) with 8 x 1024 tokens per GPU: ring all-reduce 2 (P-1)/P n bytes per rank; two-level:
   the same inside nodes at NVLink speed plus 2 (M-1)/M n/8 across; PowerSGD: the all-reduce of
   the P and Q factors; top-k: an all-gather of P x k (index, value) pairs, which grows with P.
One JSON line per measurement.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def measure(nproc, extra, d):
    m = os.path.join(d, "m.jsonl")
    if os.path.exists(m):
        os.remove(m)
    args = ["--synthetic-data", "--vocab-size", "4096", "--layers", "2", "--d-model", "256",
            "--heads", "4", "--seq-len", "64", "--micro-batch-size", "4",
            "--global-batch-size", str(4 * nproc), "--steps", "12", "--no-progress",
            "--eval-interval", "0", "--metrics-file", m, *extra]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc), "-m",
           "tardelli.train", *args]
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    rows = [json.loads(x) for x in open(m)][2:]  # the first steps warm up
    tokens = 4 * nproc * 64
    return {"dp_comm_bytes": rows[-1]["dp_comm_bytes"],
            "cross_node_bytes": rows[-1].get("cross_node_bytes"),
            "step_ms": round(1e3 * statistics.median(tokens / r["tokens_per_s"] for r in rows), 2)}


def gpt2_124m_shapes():
    import tardelli as td
    cfg = td.models.GPTConfig(arch="gpt2", vocab_size=50257, block_size=1024, n_layer=12,
                              n_head=12, d_model=768)
    model = td.models.GPT(cfg)
    return [tuple(p.shape) for _, p in model._cpp.named_parameters()]


def powersgd_elements(shapes, rank):
    sent = dense = 0
    for s in shapes:
        n = 1
        for x in s:
            n *= x
        dense += n
        if len(s) >= 2:
            rows, cols = s[0], n // s[0]
            sent += (rows + cols) * rank
        else:
            sent += n
    return sent, dense


def model_times(n_params, sent_powersgd, gpus, gbps, alpha=5e-6, per_node=8, nvlink_gbs=450.0):
    """Seconds of one step's gradient reduction per mode (bf16 gradients: 2 bytes)."""
    beta = gbps / 8 * 1e9  # bytes/s across nodes
    nv = nvlink_gbs * 1e9  # bytes/s inside a node
    P, M = gpus, gpus // per_node
    n = 2 * n_params
    ring = lambda p, bytes_, bw: 2 * (p - 1) * alpha + 2 * (p - 1) / p * bytes_ / bw  # noqa: E731
    flat = ring(P, n, beta)  # the ring's slowest link crosses nodes
    two_level = ring(per_node, n, nv) + ring(M, n / per_node, beta)
    powersgd = 2 * ring(P, 2 * sent_powersgd / 2, beta)  # P then Q, bf16 halves each
    k = 0.01 * n_params
    topk = (P - 1) * alpha + (P - 1) * k * (4 + 2) / beta  # all-gather of (int32, bf16) pairs
    return {"flat": flat, "hierarchical": two_level, "powersgd_r4": powersgd, "topk_1pct": topk}


def main():
    with tempfile.TemporaryDirectory() as d:
        for nproc in (2, 4):
            modes = [("flat", []), ("powersgd_r4", ["--grad-compression", "powersgd",
                                                    "--powersgd-rank", "4"]),
                     ("topk_1pct", ["--grad-compression", "topk", "--topk-ratio", "0.01"])]
            if nproc == 4:
                modes.insert(1, ("hierarchical_2x2", ["--hierarchical-reduce",
                                                      "--ranks-per-node", "2"]))
            for name, extra in modes:
                r = measure(nproc, extra, d)
                print(json.dumps({"bench": "comm_compression", "dp": nproc, "mode": name, **r}),
                      flush=True)
    shapes = gpt2_124m_shapes()
    sent, dense = powersgd_elements(shapes, 4)
    print(json.dumps({"bench": "powersgd_gpt2_124m", "rank": 4, "elements_sent": sent,
                      "elements_dense": dense, "ratio": round(sent / dense, 4),
                      "target": 0.05}), flush=True)
    mfu, peak, tokens = 0.40, 989e12, 8 * 1024
    compute = 6 * dense * tokens / (peak * mfu)
    for gpus in (64, 512):
        for gbps in (100, 400):
            t = model_times(dense, sent, gpus, gbps)
            print(json.dumps({"bench": "comm_model_gpt2_124m", "gpus": gpus, "link_gbps": gbps,
                              "compute_ms": round(compute * 1e3, 2),
                              **{f"{k}_ms": round(v * 1e3, 2) for k, v in t.items()}}),
                  flush=True)


if __name__ == "__main__":
    main()
