#!/usr/bin/env python3
"""How much gradient communication DDP hides behind backward.

    PYTHONPATH=python python -m tardelli.launch --nproc 2 benchmarks/dp_overlap.py
    PYTHONPATH=python python -m tardelli.launch --nproc 2 benchmarks/dp_overlap.py --zero

A GPT train step's gradient part (forward + backward + finish_grad_sync) is timed in four modes,
interleaved step by step (Note [Interleaved modes]), each reported as the median and the minimum
over --steps steps after --warmup (the slowest rank's, since a step ends when the last rank does):
  compute:    forward + backward in no_sync mode (no communication at all);
  overlap:    overlap=True (each bucket reduced from its hook as soon as it is ready);
  no_overlap: overlap=False (every bucket reduced after backward);
  comm:       the reduction of all buckets alone (launched together, then waited for).
hidden = (t_no_overlap - t_overlap) / t_comm is the fraction of the communication that overlap
hides; wait_overlap_s / wait_no_overlap_s are what finish_grad_sync waited for in each mode, and
wait_hidden = 1 - wait_overlap / wait_no_overlap.
Output: one JSON line from rank 0.

On a CPU-only box the "communication" is MPI shared-memory copies and fp32 additions done by the
ranks' own cores (the progress thread), so compute and communication compete for the same cores:
hiding is bounded by the idle core time, unlike a GPU with a separate copy/NIC engine.
"""
import argparse
import json
import statistics
import time

import tardelli as td
import tardelli.distributed as dist
from tardelli.distributed.data_parallel import DistributedDataParallel


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    p.add_argument("--zero", action="store_true", help="ZeRO-1 (reduce-scatter) buckets")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=6)
    return p.parse_args()


def slowest(seconds):
    t = td.tensor([float(seconds)])
    dist.all_reduce(t, op="max")
    return t.item()


def main():
    a = parse()
    dist.init(check_consistency=False)
    r = dist.rank()
    cfg = td.models.GPTConfig(vocab_size=a.vocab, block_size=a.seq, n_layer=a.layers,
                              n_head=a.heads, d_model=a.d_model, seed=1)
    model = td.models.GPT(cfg)
    g = td.Generator(100 + r) if hasattr(td, "Generator") else None
    tok = td.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    ddp = DistributedDataParallel(model, bucket_mb=a.bucket_mb, zero=a.zero)

    def one_step(mode):
        ddp.zero_grad()
        dist.barrier()
        t0 = time.perf_counter()
        if mode == "comm":  # every bucket launched by finish_grad_sync, no backward
            ddp.finish_grad_sync()
            return time.perf_counter() - t0, 0.0
        ddp.overlap = mode == "overlap"
        with ddp.no_sync(mode == "compute"):
            model(x, y).backward()
        if mode != "compute":
            ddp.finish_grad_sync()
        return time.perf_counter() - t0, (ddp.last_wait_seconds() if mode != "compute" else 0.0)

    # Note [Interleaved modes]: the modes alternate step by step, so slow drifts of the machine
    # (other processes, frequency) hit all of them alike; each mode reports the median and the
    # minimum of its steps (the minimum is the least disturbed run).
    modes = ("overlap", "no_overlap", "compute", "comm")
    times = {m: [] for m in modes}
    waits = {m: [] for m in modes}
    for i in range(a.warmup + a.steps):
        for m in modes:
            dt, w = one_step(m)
            if i >= a.warmup:
                times[m].append(dt)
                waits[m].append(w)
    res = {m: (slowest(statistics.median(times[m])), slowest(min(times[m])),
               slowest(statistics.median(waits[m]))) for m in modes}
    buckets = ddp.num_buckets
    def hidden(k):  # k = 0: medians, 1: minima
        t_comm = res["comm"][k]
        return round((res["no_overlap"][k] - res["overlap"][k]) / t_comm, 3) if t_comm else None

    out = {
        "benchmark": "dp_overlap", "ranks": dist.world_size(), "zero": a.zero,
        "config": {"layers": a.layers, "d_model": a.d_model, "seq": a.seq, "batch": a.batch,
                   "vocab": a.vocab, "bucket_mb": a.bucket_mb, "steps": a.steps},
        "params": sum(p.numel() for p in model.parameters()), "buckets": buckets,
    }
    for m in modes:
        out[f"t_{m}_median_s"] = round(res[m][0], 4)
        out[f"t_{m}_min_s"] = round(res[m][1], 4)
    out["wait_overlap_s"] = round(res["overlap"][2], 4)
    out["wait_no_overlap_s"] = round(res["no_overlap"][2], 4)
    out["hidden_median"] = hidden(0)
    out["hidden_min"] = hidden(1)
    # Of the wait finish_grad_sync would have without overlap, the part overlap removed.
    w_no = res["no_overlap"][2]
    out["wait_hidden"] = round(1 - res["overlap"][2] / w_no, 3) if w_no else None
    if r == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
