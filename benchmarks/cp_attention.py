#!/usr/bin/env python3
"""Context-parallel attention: time, load balance and hidden ring communication.

    PYTHONPATH=python OMP_NUM_THREADS=1 python benchmarks/cp_attention.py            # cp 1
    PYTHONPATH=python OMP_NUM_THREADS=1 python -m tardelli.launch --nproc 2 \\
        benchmarks/cp_attention.py [--cp-comm ring|a2a]                              # cp 2

One causal attention forward + backward over a sequence of --seq tokens ([--batch, --heads,
T, --head-dim] fp32), as context_parallel_attention runs it on this rank's zigzag tokens
(--nproc ranks = cp). Each rank reports, over --steps timed steps after --warmup (medians):
  step_s:      forward + backward wall time;
  blocked_s:   the time it waited for communication (the cp communicator's stats(): waits on
               the ring's receives/sends or the all-to-alls);
  compute_s:   step_s - blocked_s, this rank's attention work (wall time);
  cpu_s:       the main thread's CPU time in the step (time.thread_time; OMP_NUM_THREADS=1 runs
               the attention on it): the work itself, unaffected by other processes sharing
               the cores (wall times are, on a busy machine);
  ring_comm_s: (ring) the same transfers alone: N-1 k/v hops forward, N-1 k/v hops and N
               fp32 dk/dv hops backward, each hop posted and waited for with no compute.
Rank 0 prints one JSON line with every rank's numbers and
  single_s:    (--single-s, the cpu_s of a cp 1 run) the one-rank work of the whole sequence;
  balance:     max over ranks of cpu_s / (single_s / cp) (1.0 = perfect split; the zigzag
               layout aims at equal work on every rank), balance_min the same for the least
               loaded rank;
  hidden:      1 - blocked_s / ring_comm_s (the slowest rank): the fraction of the ring's
               communication hidden behind attention; hidden_best the same for the rank that
               waited least. blocked_s also counts waiting for a slower peer's compute (skew),
               so on a machine whose cores are shared with other work these are lower bounds.

Note: on a CPU-only box communication is MPI shared-memory copies done by the ranks' own cores,
and ranks beyond the core count share cores (timings then include waiting for a core).
"""
import argparse
import json
import statistics
import time

import tardelli as td
import tardelli.distributed as dist
from tardelli import _C


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--cp-comm", default="ring", choices=("ring", "a2a"))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--single-s", type=float, default=0.0,
                   help="the cp 1 run's cpu_s (for the balance figure)")
    return p.parse_args()


def ring_comm_only(cp, k, v, reps):
    """Median seconds of the ring's transfers alone (no compute)."""
    n, r = cp.size, cp.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    dk, dv = td.zeros(*k.shape), td.zeros(*v.shape)

    def hop(a, b, tag):
        ra, rb = td.empty(*a.shape), td.empty(*b.shape)
        works = [cp.recv(ra, prv, tag, True), cp.recv(rb, prv, tag + 1, True),
                 cp.send(a, nxt, tag, True), cp.send(b, nxt, tag + 1, True)]
        for w in works:
            w.wait()

    times = []
    for _ in range(reps):
        cp.barrier()
        t0 = time.perf_counter()
        for _ in range(n - 1):
            hop(k, v, 10)          # forward
        for _ in range(n - 1):
            hop(k, v, 10)          # backward k/v
        for _ in range(n):
            hop(dk, dv, 20)        # backward dk/dv accumulators
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    a = parse()
    world = dist.init() if not dist.is_initialized() else dist.world()
    n, r = world.size, world.rank
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    g = td.Generator(1)
    full = [td.randn(*shape, generator=g) for _ in range(4)]
    local = [_C.parallel.zigzag_slice(t, 2, r, n) if n > 1 else t for t in full]
    steps, blocked, cpu = [], [], []
    for i in range(a.warmup + a.steps):
        q, k, v = [t.detach().clone().requires_grad_(True) for t in local[:3]]
        world.barrier()
        world.reset_stats()
        t0, c0 = time.perf_counter(), time.thread_time()
        if n > 1:
            out = _C.parallel.context_parallel_attention(q, k, v, world, True, a.cp_comm)
        else:
            out = td.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        (out * local[3]).sum().backward()
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        if i >= a.warmup:
            cpu.append(dc)
            steps.append(dt)
            blocked.append(world.stats()["seconds"])
    rec = {"rank": r, "step_s": statistics.median(steps), "blocked_s": statistics.median(blocked)}
    rec["compute_s"] = rec["step_s"] - rec["blocked_s"]
    rec["cpu_s"] = statistics.median(cpu)
    if n > 1 and a.cp_comm == "ring":
        rec["ring_comm_s"] = ring_comm_only(world, local[1], local[2], a.steps)
    recs = [rec]
    if n > 1:
        keys = ["step_s", "blocked_s", "compute_s", "cpu_s", "ring_comm_s"]
        t = td.tensor([rec.get(k, 0.0) for k in keys], dtype=td.float32)
        allr = td.zeros(n * len(keys), dtype=t.dtype)
        world.all_gather(allr, t)
        vals = allr.tolist()
        recs = [dict(rank=i, **{k: vals[len(keys) * i + j] for j, k in enumerate(keys)})
                for i in range(n)]
    if r == 0:
        out = {"bench": "cp_attention", "cp": n, "cp_comm": a.cp_comm if n > 1 else "none",
               "seq": a.seq, "batch": a.batch, "heads": a.heads, "head_dim": a.head_dim,
               "step_s": max(x["step_s"] for x in recs), "ranks": recs}
        if a.single_s > 0 and n > 1:
            out["single_s"] = a.single_s
            out["balance"] = max(x["cpu_s"] for x in recs) / (a.single_s / n)
            out["balance_min"] = min(x["cpu_s"] for x in recs) / (a.single_s / n)
        if n > 1 and a.cp_comm == "ring":
            slow = max(recs, key=lambda x: x["step_s"])
            best = min(recs, key=lambda x: x["blocked_s"])
            if slow["ring_comm_s"] > 0:
                out["hidden"] = max(0.0, 1.0 - slow["blocked_s"] / slow["ring_comm_s"])
                out["hidden_best"] = max(0.0, 1.0 - best["blocked_s"] / best["ring_comm_s"])
        print(json.dumps(out))


if __name__ == "__main__":
    main()
