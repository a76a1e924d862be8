#!/usr/bin/env python3
"""Pipeline-parallel schedules measured on a GPT: step time, throughput, bubble, memory.

    PYTHONPATH=python python -m tardelli.launch --nproc 2 benchmarks/pipeline_bench.py
    PYTHONPATH=python python -m tardelli.launch --nproc 4 benchmarks/pipeline_bench.py \
        --microbatches 8 16 --layers 8

The world is one pipeline (pp = the number of ranks, dp = tp = 1). For each schedule (gpipe,
1f1b, interleaved with --vpp chunks per rank, zb) and each --microbatches m, every rank builds
its stages of the same GPT (td.distributed.pipeline_parallel.build_stages: the same seed gives
the same model for every schedule), and a train step is PipelineRuntime.step over m fixed
random micro-batches + clip_grad_norm_ over the pipeline group + AdamW step + zero_grad. After
--warmup untimed steps each of --steps steps is timed between two barriers (rank 0's clock: the
step ends when the last rank does).

Note [Interleaved rounds]: the schedules of one m run side by side (each with its own stages and
optimizer), one step of each per round, so that a load change on a shared machine hits every
schedule alike instead of whichever happened to run then.

Reported, medians over the timed steps:
  - step_ms, tokens_per_s (m x micro batch x seq_len tokens per step);
  - bubble_measured: td.distributed.pipeline.bubble_fraction of gather_timelines(), i.e.
    1 - compute / (ranks x span of the step's actions), where compute is the time inside the
    forward / backward actions (waiting for a neighbour's activations, Python between actions
    and the optimizer are bubble);
  - bubble_formula: the textbook value ((p-1)/(m+p-1), interleaved (p-1)/(v m+p-1), ZB-H1
    (p-1)/(3m+p-1));
  - bubble_simulated: td.distributed.pipeline.simulate of the schedule with the MEASURED mean
    durations of F, B (or I and W under zb) over all ranks (one cost per kind for every stage,
    so it sees the schedule's idle time but not the imbalance between stages; communication
    costs nothing in it);
  - per stage: mean F / B / I / W milliseconds; peak_bytes = state_bytes (parameters and
    AdamW's moments) + step_peak_bytes (the allocator's peak during a step above what was live
    before it: gradients, the in-flight activations and temporaries; measured in one extra step
    after the timed ones); and the schedule's peak number of micro-batches in flight (from the
    simulator).
With --baseline (default), rank 0 also trains the whole model alone (no pipeline, gradient
accumulation over the same m micro-batches, one core per rank) for comparison.

Output: JSON lines from rank 0, one per (schedule, m), the LAST line the summary.
"""
import argparse
import json
import os
import statistics
import time

import tardelli as td
import tardelli.distributed as dist
from tardelli.distributed import clip_grad_norm_
from tardelli.distributed import pipeline as sched
from tardelli.distributed.pipeline_parallel import PipelineRuntime, build_stages, stage_layout

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    p.add_argument("--vpp", type=int, default=2, help="chunks per rank for interleaved")
    p.add_argument("--layout", default="",
                   help="layers per stage for the non-interleaved schedules, e.g. 3,1 (the last "
                        "stage also runs the LM head); default even")
    p.add_argument("--steps", type=int, default=5, help="measured steps (median)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def gather_ints(group, values):
    """[group.size][len(values)] of every rank's ints."""
    n = len(values)
    out = td.zeros(group.size * n, dtype=td.int64)
    group.all_gather(out, td.tensor([int(v) for v in values], dtype=td.int64))
    flat = [int(v) for v in out.tolist()]
    return [flat[r * n:(r + 1) * n] for r in range(group.size)]


def durations(timelines):
    """Per rank {kind: mean seconds}, and {kind: mean seconds} over every rank."""
    per_rank, pooled = [], {}
    for rank in timelines:
        kinds = {}
        for kind, _, _, start, end in rank:
            kinds.setdefault(kind, []).append(end - start)
            pooled.setdefault(kind, []).append(end - start)
        per_rank.append({k: statistics.fmean(v) for k, v in kinds.items()})
    return per_rank, {k: statistics.fmean(v) for k, v in pooled.items()}


def simulated_bubble(kind, pp, m, vpp, mean):
    """The simulator's bubble for the schedule with the measured mean action costs. simulate()
    takes the costs of a whole stage's pass and charges an interleaved chunk 1/vpp of them, so a
    measured chunk pass is scaled by vpp; a full backward costs BI + BW (split evenly, only the
    sum matters outside zb)."""
    v = vpp if kind == "interleaved" else 1
    f = mean["F"] * v
    if kind == "zb":
        bi, bw = mean["I"], mean["W"]
    else:
        bi = bw = mean["B"] * v / 2
    return sched.simulate(sched.make_schedule(kind, pp, m, v), f, bi, bw)


def step_peak_bytes(step):
    """The allocator's peak during step() above the bytes live before it (this process holds
    every schedule's model at once, Note [Interleaved rounds]; gradients are None between
    steps, so this is activations, gradients and temporaries)."""
    td.reset_peak_memory_stats()
    before = td.memory_stats()["current_bytes"]
    step()
    return td.memory_stats()["peak_bytes"] - before


def state_bytes(models):
    """Parameters and AdamW's two moments (fp32 master copies)."""
    return sum(3 * p.numel() * 4 for m in models for p in m.parameters())


def make_config(a):
    return td.models.GPTConfig(arch=a.arch, vocab_size=a.vocab_size, block_size=a.seq_len,
                               n_layer=a.layers, n_head=a.heads, d_model=a.d_model,
                               dropout=0.0, seed=a.seed, dtype=a.dtype)


def micro_batches(a, m):
    g = td.Generator(a.seed + m)
    tok = td.randint(0, a.vocab_size, (m, a.micro_batch_size, a.seq_len + 1), generator=g)
    return [(tok[i, :, :-1].contiguous(), tok[i, :, 1:].contiguous()) for i in range(m)]


def optimizer(chunks):
    groups = [{"params": [p for ch in chunks for p in ch.param_groups(0.1)[i]["params"]],
               "weight_decay": 0.1 if i == 0 else 0.0} for i in range(2)]
    return td.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95))


class ScheduleRun:
    """One schedule's pipeline (its own stages, optimizer and runtime) and its measurements."""

    def __init__(self, a, grid, kind, m):
        self.a, self.grid, self.kind, self.m = a, grid, kind, m
        self.vpp = a.vpp if kind == "interleaved" else 1
        layout = [int(x) for x in a.layout.split(",")] if a.layout and self.vpp == 1 else None
        self.layout = stage_layout(a.layers, grid.dims.pp, self.vpp, layout)
        self.chunks = build_stages(make_config(a), grid.coords.pp, grid.dims.pp, self.vpp, layout)
        for ch in self.chunks:
            ch.train()
        self.opt = optimizer(self.chunks)
        self.pipe = PipelineRuntime(self.chunks, grid, kind, m, a.micro_batch_size, a.seq_len)
        self.batches = micro_batches(a, m)
        self.mp = grid.group("tp-pp")
        self.losses, self.times, self.pipe_s, self.bubbles = [], [], [], []
        self.per_rank, self.pooled = [], []
        self.peaks = None

    def step(self):
        loss = self.pipe.step(self.batches)
        clip_grad_norm_(self.chunks, 1.0, self.mp)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(loss)

    def timed_step(self, world):
        world.barrier()
        t0 = time.perf_counter()
        self.step()
        world.barrier()
        self.times.append(time.perf_counter() - t0)
        self.pipe_s.append(self.pipe.last_stats["step_s"])
        tl = self.pipe.gather_timelines()
        self.bubbles.append(sched.bubble_fraction(tl))
        per_rank, pooled = durations(tl)
        self.per_rank.append(per_rank)
        self.pooled.append(pooled)

    def memory_step(self):
        step_peak = step_peak_bytes(self.step)
        self.peaks = gather_ints(self.grid.pp(), [step_peak, state_bytes(self.chunks)])

    def row(self):
        a, pp, m, vpp = self.a, self.grid.dims.pp, self.m, self.vpp
        med = statistics.median
        mean = {k: med([p[k] for p in self.pooled]) for k in self.pooled[0]}
        per_rank = [{k: med([s[r][k] for s in self.per_rank]) for k in self.per_rank[0][r]}
                    for r in range(pp)]
        sim = simulated_bubble(self.kind, pp, m, vpp, mean)
        step_s = med(self.times)
        return {
            "schedule": self.kind, "pp": pp, "vpp": vpp, "microbatches": m,
            "layout": self.layout,
            "step_ms": round(step_s * 1e3, 1), "step_ms_min": round(min(self.times) * 1e3, 1),
            "pipe_step_ms": round(med(self.pipe_s) * 1e3, 1),
            "tokens_per_s": round(m * a.micro_batch_size * a.seq_len / step_s, 1),
            "bubble_measured": round(med(self.bubbles), 4),
            "bubble_formula": round(sched.bubble_formula(self.kind, pp, m, vpp), 4),
            "bubble_simulated": round(sim.bubble_fraction, 4),
            "mean_ms": {k: round(v * 1e3, 2) for k, v in sorted(mean.items())},
            "stage_mean_ms": [{k: round(v * 1e3, 2) for k, v in sorted(r.items())}
                              for r in per_rank],
            "peak_bytes": [sum(p) for p in self.peaks],
            "step_peak_bytes": [p[0] for p in self.peaks],
            "state_bytes": [p[1] for p in self.peaks],
            "peak_in_flight": list(sim.peak_in_flight),
            "losses": [round(x, 5) for x in self.losses[:3]],
        }


class BaselineRun:
    """Rank 0 alone: the whole model, gradient accumulation over the same m micro-batches."""

    def __init__(self, a, m):
        self.a, self.m = a, m
        self.model = td.models.GPT(make_config(a))
        self.model.train()
        self.opt = optimizer([self.model])
        self.params = list(self.model.parameters())
        self.batches = micro_batches(a, m)
        self.losses, self.times, self.peak = [], [], 0

    def step(self):
        total = 0.0
        for x, y in self.batches:
            loss = self.model(x, y)
            (loss * (1.0 / self.m)).backward()
            total += loss.item()
        td.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(total / self.m)

    def timed_step(self):
        t0 = time.perf_counter()
        self.step()
        self.times.append(time.perf_counter() - t0)

    def memory_step(self):
        self.peak = (step_peak_bytes(self.step), state_bytes([self.model]))

    def row(self):
        step_s = statistics.median(self.times)
        return {"schedule": "none (1 rank)", "pp": 1, "microbatches": self.m,
                "step_ms": round(step_s * 1e3, 1),
                "step_ms_min": round(min(self.times) * 1e3, 1),
                "tokens_per_s": round(self.m * self.a.micro_batch_size * self.a.seq_len /
                                      step_s, 1),
                "peak_bytes": [sum(self.peak)], "step_peak_bytes": [self.peak[0]],
                "state_bytes": [self.peak[1]], "losses": [round(x, 5) for x in self.losses[:3]]}


def bench(a, world, grid, m):
    """Every schedule (and the baseline) at m micro-batches, their steps interleaved round by
    round (Note [Interleaved rounds]); returns the rows."""
    runs = []
    for kind in a.schedules:
        if kind == "interleaved" and (m < world.size or m % world.size != 0 or
                                      a.layers % (world.size * a.vpp) != 0):
            continue
        runs.append(ScheduleRun(a, grid, kind, m))
    base = BaselineRun(a, m) if a.baseline and world.rank == 0 else None

    def baseline(fn):
        if base is not None:
            fn(base)
        if a.baseline:
            world.barrier()

    for _ in range(a.warmup):
        baseline(BaselineRun.step)
        for r in runs:
            r.step()
    for _ in range(a.steps):
        baseline(BaselineRun.timed_step)
        for r in runs:
            r.timed_step(world)
    baseline(BaselineRun.memory_step)
    for r in runs:
        r.memory_step()
    rows = ([base.row()] if base is not None else []) + [r.row() for r in runs]
    return rows


def main():
    a = parse_args()
    world = dist.init(check_consistency=False)
    if world.size < 2:
        raise SystemExit("pipeline_bench.py: run it with python -m tardelli.launch --nproc >= 2")
    grid = dist.ProcessGrid(world, dist.ParallelDims(pp=world.size))
    rows = []
    for m in a.microbatches:
        for row in bench(a, world, grid, m):
            if world.rank == 0:
                rows.append(row)
                print(json.dumps(row), flush=True)
    if world.rank == 0:
        print(json.dumps({
            "bench": "pipeline", "arch": a.arch, "dtype": a.dtype, "layers": a.layers,
            "d_model": a.d_model, "heads": a.heads, "seq_len": a.seq_len,
            "micro_batch_size": a.micro_batch_size, "vocab_size": a.vocab_size,
            "pp": world.size, "vpp": a.vpp, "layout": a.layout or "even",
            "omp_num_threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
            "steps": a.steps, "warmup": a.warmup,
            "loadavg_1min": round(os.getloadavg()[0], 2), "rows": rows}), flush=True)
    dist.destroy()


if __name__ == "__main__":
    main()
