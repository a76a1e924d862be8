#!/usr/bin/env python3
"""What a tensor-parallel group costs per GPT train step: time, memory, communication.

    PYTHONPATH=python python -m tardelli.launch --nproc 1 benchmarks/tp_step.py   # tp=1 baseline
    PYTHONPATH=python python -m tardelli.launch --nproc 2 benchmarks/tp_step.py
    PYTHONPATH=python python -m tardelli.launch --nproc 2 benchmarks/tp_step.py --sequence-parallel

Every rank builds the same GPT (same seed: the full weights) and td.distributed.parallelize lays
it out with tp = the world size (td.distributed.parallelize), dp = 1 (Megatron's tensor parallelism; with --sequence-parallel
also the sequence split between the layers). A train step is forward (mean cross-entropy) +
backward + AdamW step + zero_grad, on the same fixed random tokens on every rank; after
--warmup untimed steps each of --steps steps is timed between two barriers of the world
communicator, and a step's time is the slowest rank's (the step ends when the last rank does).
Reported: medians over the steps.

Communication is read from the tp group's own communicator (Communicator.stats(), Note
[Communication accounting] in src/distributed/communicator.cpp): calls and input bytes per step
(exact), and the seconds the rank was blocked in them (exposed communication time: the whole
call for the blocking collectives the tensor-parallel layers use), as a share of the step. The
barriers and the slowest-rank exchange of the benchmark itself run on the world communicator and
are not counted.

Memory per rank, from td's allocator (td.memory_stats(), live tensor bytes): param_bytes (this
rank's parameter shards), activation_bytes (live bytes after forward minus before: what the
step keeps for backward, the loss included), step_peak_bytes (the allocator's peak during the
step minus the live bytes before it: activations, gradients and temporaries) and peak_bytes (the
absolute peak: parameters, optimizer state and all of that). Measured in --memory-steps extra
steps after the timed ones, so the stats calls do not touch the timing.

Output: JSON lines from rank 0, one per measured step, the LAST line the summary.
"""
import argparse
import json
import os
import statistics
import time

import tardelli as td
import tardelli.distributed as dist
from tardelli.distributed.model_parallel import parallelize


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=0, help="0: = heads")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--steps", type=int, default=8, help="measured steps (median)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--memory-steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def slowest(world, values):
    """The elementwise maximum of a list of floats (seconds) over the world's ranks."""
    t = td.tensor([float(v) for v in values], dtype=td.float32)
    world.all_reduce(t, "max")
    return t.tolist()


def largest(world, values):
    """The elementwise maximum of a list of ints (bytes) over the world's ranks."""
    t = td.tensor([int(v) for v in values], dtype=td.int64)
    world.all_reduce(t, "max")
    return [int(v) for v in t.tolist()]


def main():
    a = parse_args()
    world = dist.init(check_consistency=False)
    n, rank = world.size, world.rank
    if a.sequence_parallel and n == 1:
        raise SystemExit("tp_step.py: --sequence-parallel needs tp > 1 (--nproc >= 2)")
    grid = dist.ProcessGrid(world, dist.ParallelDims(tp=n, dp=1))
    tp = grid.tp()

    cfg = td.models.GPTConfig(arch=a.arch, vocab_size=a.vocab_size, block_size=a.seq_len,
                              n_layer=a.layers, n_head=a.heads, n_kv_head=a.kv_heads,
                              d_model=a.d_model, dropout=0.0, seed=a.seed, dtype=a.dtype)
    model = td.models.GPT(cfg)
    parallelize(model, grid, sequence_parallel=a.sequence_parallel)
    model.train()
    opt = td.optim.AdamW(model.param_groups(weight_decay=0.1), lr=3e-4, betas=(0.9, 0.95))
    g = td.Generator(a.seed)
    tok = td.randint(0, a.vocab_size, (a.micro_batch_size, a.seq_len + 1), generator=g)
    x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    mem = {}

    def step(measure=False):
        if measure:
            td.reset_peak_memory_stats()
            before = td.memory_stats()["current_bytes"]
        loss = model(x, y)
        if measure:
            mem.setdefault("activation", []).append(td.memory_stats()["current_bytes"] - before)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if measure:
            peak = td.memory_stats()["peak_bytes"]
            mem.setdefault("step_peak", []).append(peak - before)
            mem.setdefault("peak", []).append(peak)
        return float(loss.item())

    losses = [step() for _ in range(a.warmup)]
    times, comm_s, calls, nbytes = [], [], [], []
    for i in range(a.steps):
        world.barrier()
        tp.reset_stats()
        t0 = time.perf_counter()
        losses.append(step())
        dt = time.perf_counter() - t0
        s = tp.stats()
        dt_max, comm_max = slowest(world, [dt, s["seconds"]])
        times.append(dt_max)
        comm_s.append(s["seconds"])
        calls.append(s["calls"])
        nbytes.append(s["bytes"])
        if rank == 0:
            print(json.dumps({"step": i, "step_ms": round(dt_max * 1e3, 2),
                              "comm_ms": round(s["seconds"] * 1e3, 2),
                              "comm_ms_max_rank": round(comm_max * 1e3, 2),
                              "loss": losses[-1]}), flush=True)
    for _ in range(a.memory_steps):
        step(measure=True)

    param_bytes = sum(p.numel() * 4 for p in model.parameters())  # fp32 master weights
    # Per-rank figures as the maximum over the ranks (the ranks of a tp group are alike, up to
    # the vocabulary padding and timing noise).
    step_s = statistics.median(times)
    comm = statistics.median(comm_s)
    (comm_max,) = slowest(world, [comm])
    param_max, act_max, step_peak_max, peak_max = largest(
        world, [param_bytes, max(mem["activation"]), max(mem["step_peak"]), max(mem["peak"])])
    tokens = a.micro_batch_size * a.seq_len
    summary = {
        "bench": "tp_step", "arch": a.arch, "dtype": a.dtype, "layers": a.layers,
        "d_model": a.d_model, "heads": a.heads, "kv_heads": a.kv_heads or a.heads,
        "seq_len": a.seq_len, "micro_batch_size": a.micro_batch_size, "vocab_size": a.vocab_size,
        "tp": n, "sequence_parallel": a.sequence_parallel,
        "omp_num_threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
        "steps": a.steps, "warmup": a.warmup,
        "n_params": model.num_parameters(), "local_params": model.local_num_parameters(),
        "step_ms": round(step_s * 1e3, 2), "step_ms_min": round(min(times) * 1e3, 2),
        "tokens_per_s": round(tokens / step_s, 1),
        "comm_calls_per_step": calls[-1], "comm_bytes_per_step": nbytes[-1],
        "comm_s_per_step": round(comm, 4), "comm_s_per_step_max_rank": round(comm_max, 4),
        "comm_share": round(comm / step_s, 3),
        "param_bytes": int(param_max), "activation_bytes": int(act_max),
        "step_peak_bytes": int(step_peak_max), "peak_bytes": int(peak_max),
        "first_losses": losses[:3],
        "loadavg_1min": round(os.getloadavg()[0], 2),
    }
    if rank == 0:
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
