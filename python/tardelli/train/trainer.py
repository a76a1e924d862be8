"""The training loop behind `python -m tardelli.train`, written top to bottom:

    config -> data (Megatron-format dataset or synthetic tokens) -> model (td.models.GPT)
    -> AdamW over the model's decay/no-decay groups -> [resume from the latest checkpoint]
    -> for each step: lr from the schedule, gradient accumulation over micro-batches, clip,
       AdamW step; log, evaluate, checkpoint
    -> final checkpoint, loss-curve PNG, summary JSON line.

Note [Exact resume]: everything a later step depends on is in the checkpoint: parameters,
AdamW moments and step counts, the schedule's step, the data position (samples consumed: the
dataset order is a pure function of the seed) and the dropout generator's Philox state. The
ops are deterministic for a given thread count, so on the CPU in fp32 a resumed run repeats the
uninterrupted run's losses bitwise (tests/python/test_train.py checks it).
"""
import json
import math
import os
import statistics
import time

import tardelli as td

from .. import _C
from ..distributed import supervisor
from . import config as C
from . import precision
from . import report
from . import state as ckpt


class SyntheticData:
    """Uniform random tokens, a pure function of (seed, global sample index): sample i is
    drawn from Philox subsequence i. Batches follow the dataset loader's sampler (a step of
    micro-batches takes micro_batch x dp_size consecutive samples, rank r its slice), so the
    data position is just the sample count, as for real data."""

    def __init__(self, vocab_size, seq_len, seed, micro_batch, dp_rank=0, dp_size=1,
                 consumed_samples=0):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.micro_batch, self.dp_rank, self.dp_size = micro_batch, dp_rank, dp_size
        self.consumed_samples = consumed_samples

    def sample(self, i):
        g = td.Generator(self.seed ^ 0x5EED5EED, i)
        return td.randint(0, self.vocab_size, (self.seq_len + 1,), generator=g)

    def next(self):
        first = self.consumed_samples + self.dp_rank * self.micro_batch
        rows = td.stack([self.sample(first + j) for j in range(self.micro_batch)])
        self.consumed_samples += self.micro_batch * self.dp_size
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class Data:
    """The run's data: train/valid loaders, vocabulary size and (for real data) the tokenizer
    directory written by preprocess (PREFIX.tokenizer/)."""

    def __init__(self, cfg, dp_rank=0, dp_size=1, cp=None):
        self.cfg, self.dp_rank, self.dp_size, self.cp = cfg, dp_rank, dp_size, cp
        self.tokenizer_dir = None
        if cfg.synthetic_data:
            self.vocab_size = cfg.vocab_size
            self.train = self.valid = None
            return
        tok_dir = cfg.data + ".tokenizer"
        if os.path.isdir(tok_dir):
            self.tokenizer_dir = tok_dir
        if cfg.vocab_size:
            self.vocab_size = cfg.vocab_size
        elif self.tokenizer_dir:
            from ..data.tokenizer import Tokenizer
            self.vocab_size = Tokenizer.load(tok_dir).vocab_size
        else:
            raise C.ConfigError(f"--data {cfg.data}: no tokenizer at {tok_dir}; give "
                                "--vocab-size")
        self.train, self.valid, _ = td.data.build_gpt_datasets(
            cfg.data, cfg.seq_len, cfg.seed, split=C.split_ratios(cfg))
        if self.train is None:
            raise C.ConfigError(f"--data {cfg.data} --split {cfg.split}: the training split "
                                "is empty")

    def train_loader(self, consumed_samples):
        if self.cfg.synthetic_data:
            return self._on_device(SyntheticData(
                self.vocab_size, self.cfg.seq_len, self.cfg.seed, self.cfg.micro_batch_size,
                self.dp_rank, self.dp_size, consumed_samples))
        return self._on_device(td.data.DataLoader(
            self.train, self.cfg.micro_batch_size, self.dp_rank, self.dp_size,
            consumed_samples))

    def _on_device(self, loader):
        if self.cp is not None and self.cp.size > 1:
            loader = ContextParallelLoader(loader, self.cp)
        return loader if self.cfg.device == "cpu" else DeviceLoader(loader, self.cfg.device)

    def valid_loader(self):
        """A fresh loader over the validation split from its start (every evaluation sees the
        same batches, so validation losses are comparable across steps); None if empty."""
        if self.cfg.synthetic_data:
            return self._on_device(SyntheticData(
                self.vocab_size, self.cfg.seq_len, self.cfg.seed + 1, self.cfg.micro_batch_size,
                self.dp_rank, self.dp_size))
        if self.valid is None:
            return None
        return self._on_device(td.data.DataLoader(
            self.valid, self.cfg.micro_batch_size, self.dp_rank, self.dp_size, 0))


class ContextParallelLoader:
    """A loader whose (x, y) batches are cut to this cp rank's zigzag tokens (chunks r and
    2cp-1-r of 2cp; Note [Zigzag layout] in include/tardelli/parallel/context_parallel.h): the
    ranks of a cp group read the same samples and each keeps its part."""

    def __init__(self, loader, cp):
        self._loader, self._cp = loader, cp

    def next(self):
        from ..distributed.model_parallel import context_parallel_slice
        x, y = self._loader.next()
        return context_parallel_slice(x, self._cp), context_parallel_slice(y, self._cp)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class DeviceLoader:
    """A loader whose (x, y) batches are copied to `device`: the data pipeline stays on the
    host. Everything else (consumed_samples, ...) is the wrapped loader's."""

    def __init__(self, loader, device):
        self._loader, self._device = loader, device

    def next(self):
        x, y = self._loader.next()
        return x.to(self._device), y.to(self._device)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def model_config(cfg, vocab_size):
    return td.models.GPTConfig(
        arch=cfg.arch, vocab_size=vocab_size, block_size=cfg.seq_len, n_layer=cfg.layers,
        n_head=cfg.heads, n_kv_head=cfg.kv_heads, d_model=cfg.d_model,
        ffn_hidden=cfg.ffn_hidden, dropout=cfg.dropout, dtype=cfg.dtype, seed=cfg.seed,
        num_experts=cfg.num_experts, moe_top_k=cfg.moe_top_k, moe_ffn_hidden=cfg.moe_ffn_hidden,
        moe_layer_freq=cfg.moe_layer_freq, moe_shared_experts=cfg.moe_shared_experts,
        moe_aux_loss_coeff=cfg.moe_aux_loss_coeff, moe_z_loss_coeff=cfg.moe_z_loss_coeff,
        moe_router_bias_update_rate=cfg.moe_router_bias_update_rate,
        moe_capacity_factor=cfg.moe_capacity_factor)


def schedule(cfg):
    """The learning rate of step s (0-based optimizer steps), td.optim.lr_scheduler's
    formulas (the same as the C++ td::optim::lr_at)."""
    fn = {"cosine": td.optim.lr_scheduler.warmup_cosine_lr,
          "linear": td.optim.lr_scheduler.linear_decay_lr,
          "constant": td.optim.lr_scheduler.constant_lr}[cfg.lr_decay_style]
    return lambda s: fn(s, cfg.warmup_steps, cfg.steps, cfg.lr, cfg.min_lr_value)


def gemm_peak_flops(dtype, device="cpu", n=None, reps=5):
    """The best GEMM rate of this library on this machine for `dtype` (FLOP/s): the
    denominator of MFU, measured once at start-up (on a GPU: 4096^3, synchronized)."""
    gpu = device != "cpu"
    n = n or (4096 if gpu else 1024)
    a = td.randn(n, n).to(dtype).to(device)
    b = td.randn(n, n).to(dtype).to(device)
    sync = td.cuda.synchronize if gpu else (lambda: None)
    td.matmul(a, b)
    sync()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        td.matmul(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def _sum_over_group(value, group):
    from ..distributed.model_parallel import _sum_over
    return _sum_over(value, group)


def evaluate_pipeline(pipe, chunks, loader, steps):
    if loader is None or steps == 0:
        return None
    for ch in chunks:
        ch.eval()
    loss = pipe.forward_only([loader.next() for _ in range(steps)])
    for ch in chunks:
        ch.train()
    return loss


def evaluate(model, loader, steps):
    if loader is None or steps == 0:
        return None
    model.eval()
    total = 0.0
    with td.no_grad():
        for _ in range(steps):
            x, y = loader.next()
            total += model(x, y).item()
    model.train()
    return total / steps


def join_world():
    """The world communicator when this process was started as one rank of several (by
    `python -m tardelli.launch`, mpirun or srun), else None (a single process needs no MPI)."""
    size = None
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            size = int(os.environ[name])
            break
    if not size or size == 1:
        return None
    from .. import distributed as dist
    return dist.world() if dist.is_initialized() else dist.init()


def _mean_over_ranks(value, world):
    if world is None or world.size == 1:
        return value
    t = td.tensor([value], dtype=td.float32)
    world.all_reduce(t, "avg")
    return t.item()


def _max_over_ranks(value, world):
    if world is None or world.size == 1:
        return int(value)
    t = td.tensor([int(value)], dtype=td.int64)
    world.all_reduce(t, "max")
    return int(t.item())


def _any_over_ranks(flag, world):
    """Whether `flag` holds on any rank of `world` (an int max: exact, whatever the order)."""
    return bool(_max_over_ranks(bool(flag), world))


def job_communicators(grid):
    """The communicators of a job's process grid (world and every built group, each once):
    whatever the layout (dp, tp, cp, pp, ep), the training step communicates only on these."""
    if grid is None:
        return []
    comms = [grid.world()]
    for name in grid.group_names():
        c = grid.group(name)
        if all(c is not d for d in comms):
            comms.append(c)
    return comms


def ddp_parts(ddp):
    """The DistributedDataParallel objects behind `ddp`: both of an ExpertDataParallel, else
    ddp itself (ZeRO-3: the FSDP's DDP); none without one."""
    if ddp is None:
        return []
    return [ddp.dense, ddp.experts] if hasattr(ddp, "dense") else [ddp]


def reduction_communicators(ddp):
    """The communicators the gradient reductions (and ZeRO gathers) of `ddp` run on."""
    out = []
    for p in ddp_parts(ddp):
        if all(p.group is not c for c in out):
            out.append(p.group)
    return out


def comm_bytes(comms):
    """Bytes handed to `comms` so far (their input bytes: Note [Communication accounting])."""
    return sum(c.stats()["bytes"] for c in comms)


def comm_blocked_seconds(comms):
    """Seconds this rank's callers have spent blocked in `comms` so far: collectives (their
    consistency checks included), sends, receives and Work waits (Communicator.stats(), Note
    [Communication accounting] in src/distributed/communicator.cpp)."""
    return sum(c.stats()["seconds"] for c in comms)


def gather_step_times(compute, wait, world):
    """Every world rank's (compute, wait) seconds of this step as two lists indexed by world
    rank: one all-gather of two floats per rank (single-element lists for one process)."""
    if world is None or world.size == 1:
        return [compute], [wait]
    out = td.zeros(2 * world.size, dtype=td.float32)
    world.all_gather(out, td.tensor([compute, wait], dtype=td.float32))
    flat = out.tolist()
    return flat[0::2], flat[1::2]


# A straggler must also be this much slower than the median in absolute terms: on steps of a
# few milliseconds the ratio is scheduler noise (2 ranks sharing cores swing by 20-30%).
STRAGGLER_MIN_EXCESS_S = 0.01


def stragglers(compute, threshold):
    """[(world rank, ratio)] of the ranks whose compute time exceeds `threshold` x the median
    over ranks and the median by STRAGGLER_MIN_EXCESS_S; none for one rank or threshold 0."""
    if threshold <= 0 or len(compute) < 2:
        return []
    median = statistics.median(compute)
    if median <= 0:
        return []
    return [(r, c / median) for r, c in enumerate(compute)
            if c > threshold * median and c - median > STRAGGLER_MIN_EXCESS_S]


def slow_rank_seconds(rank):
    """Testing aid: the env var TD_TEST_SLOW_RANK="RANK:SECONDS" makes world rank RANK sleep
    SECONDS in every step's compute (a simulated straggler); 0.0 on the other ranks or unset."""
    spec = os.environ.get("TD_TEST_SLOW_RANK", "")
    if not spec:
        return 0.0
    try:
        r, seconds = spec.split(":")
        r, seconds = int(r), float(seconds)
    except ValueError:
        raise C.ConfigError(f"TD_TEST_SLOW_RANK={spec!r}: expected RANK:SECONDS, e.g. 1:0.5") \
            from None
    return seconds if r == rank else 0.0


def _sum_ints_over(rows, group):
    """Lists of ints summed elementwise over a process group (one all-reduce)."""
    flat = [int(x) for r in rows for x in r]
    if group is None or group.size == 1 or not flat:
        return [list(r) for r in rows]
    t = td.tensor(flat, dtype=td.int64)
    group.all_reduce(t, "sum")
    flat, out = t.tolist(), []
    for r in rows:
        out.append([int(x) for x in flat[:len(r)]])
        flat = flat[len(r):]
    return out


def moe_step_metrics(chunks, loss_sum, accum, dp_group, pp_group=None):
    """Note [MoE metrics]: the step's MoE statistics over its micro-batches (the model's stats
    are reset at the step's start), data-parallel ranks and pipeline stages, and its mean
    cross-entropy. `chunks`: this rank's model (or pipeline chunks).

    A training forward returns CE + sum over MoE layers of (aux_coeff x aux + z_coeff x z); the
    statistics hold each layer's unscaled aux and z summed over forwards, so the cross-entropy
    is loss_sum minus those terms (equal to the forward's CE up to fp32 rounding). The metrics:
    moe_aux_loss, moe_z_loss: unscaled, mean over layers and forwards (and dp ranks);
    moe_max_load: max over layers of the busiest expert's token-slots / the mean per expert (a
    ratio: 1.0 is perfect balance, E / top_k the worst); moe_mean_load: that ratio averaged over
    layers; moe_dropped_tokens: token-slots over capacity, summed over layers and dp ranks.
    Loads are counted over the whole global batch (summed over dp) before the capacity.
    Pipeline: the loss (from the last stage) holds the last stage's terms only (the others'
    are backpropagated apart: Note [MoE losses of a pipeline stage]), and the per-layer
    statistics are combined over the pp group."""
    cfg = chunks[0].config
    layers, dropped, terms = [], 0, 0.0
    for ch in chunks:
        st = ch.moe_stats()
        layers += st["layers"]
        dropped += st["dropped"]
        if ch.stage[3]:  # the chunk whose loss carries its layers' terms
            terms += sum(cfg.moe_aux_loss_coeff * lay["aux_loss"] +
                         cfg.moe_z_loss_coeff * lay["z_loss"] for lay in st["layers"])
    counts = _sum_ints_over([lay["tokens_per_expert"] for lay in layers] + [[dropped]],
                            dp_group)
    dropped = counts.pop()[0]
    ratios = []
    for c in counts:
        mean = sum(c) / len(c)
        ratios.append(max(c) / mean if mean > 0 else 0.0)
    # As MoEStats::aux_loss(): the sums over layers and forwards over the count of forwards.
    sums = [sum(lay["aux_loss"] for lay in layers), sum(lay["z_loss"] for lay in layers),
            sum(lay["forwards"] for lay in layers), len(layers), sum(ratios), terms, dropped]
    max_ratio = max(ratios, default=0.0)
    if pp_group is not None and pp_group.size > 1:
        sums = [_sum_over_group(v, pp_group) for v in sums]
        t = td.tensor([max_ratio], dtype=td.float32)
        pp_group.all_reduce(t, "max")
        max_ratio = t.item()
    aux, z, forwards, n, ratio_sum, terms, dropped = sums
    return (loss_sum - terms) / accum, {
        "moe_aux_loss": aux / forwards if forwards > 0 else 0.0,
        "moe_z_loss": z / forwards if forwards > 0 else 0.0, "moe_max_load": max_ratio,
        "moe_mean_load": ratio_sum / n if n > 0 else 0.0,
        "moe_dropped_tokens": int(round(dropped))}


def update_moe_router_bias(model, dp_group):
    """Note [MoE bias over dp]: the aux-loss-free bias step on the loads of the whole global
    batch: each rank's pending router loads are summed over the data-parallel group first, so
    every replica applies the same update (and the result equals a single-rank run's)."""
    model.moe_router_load = _sum_ints_over(model.moe_router_load, dp_group)
    model.update_moe_router_bias()


def _moe_bias_replicated(chunks, dp_group):
    """Whether the expert biases are bitwise equal on every rank of dp_group (a collective)."""
    biases = [b for ch in chunks for _, b in ch._cpp.named_buffers()]
    if dp_group is None or dp_group.size == 1 or not biases:
        return True
    flat = td.cat([b.reshape(-1) for b in biases])
    hi, lo = flat.clone(), flat.clone()
    dp_group.all_reduce(hi, "max")
    dp_group.all_reduce(lo, "min")
    return bool(td.equal(hi, flat) and td.equal(lo, flat))


def setup_layout(cfg, world=None):
    """The job's layout: (world, dp_size, grid). Joins a world of one when a parallel feature
    needs communicators; validates cfg for the data-parallel size; builds the ProcessGrid
    (None for one plain process)."""
    from .. import distributed as dist
    if (cfg.zero or cfg.tp > 1 or cfg.pp > 1 or cfg.cp > 1 or cfg.ep > 1) and world is None:
        world = dist.world() if dist.is_initialized() else dist.init()  # a world of one
    size = world.size if world is not None else 1
    mp = cfg.tp * cfg.pp * cfg.cp
    if size % mp != 0:
        raise C.ConfigError(f"--tp {cfg.tp} x --cp {cfg.cp} x --pp {cfg.pp} does not divide the "
                            f"{size} ranks of this job (data-parallel size = ranks / (tp x cp x "
                            "pp); start the ranks with python -m tardelli.launch --nproc N)")
    dp_size = size // mp
    C.validate(cfg, dp_size)
    if world is not None and size > 1 and cfg.device != "cpu":
        # Note [Ranks on GPUs]: each rank trains on cuda:{local rank % devices}; its groups move
        # CUDA tensors through host memory over MPI (host_staged.h), which also serves several
        # ranks sharing one GPU (NCCL needs one rank per device: not wired to the trainer yet).
        cfg.device = dist.device_for_rank(cfg.device)
        world = dist.host_staged(world)
    elif world is not None and os.environ.get("TD_TEST_STAGE_HOST_TENSORS") == "1":
        # Testing aid: CPU ranks stage their tensors as GPU ranks do (the CPU stand-in).
        world = dist.host_staged(world, stage_host_tensors=True)
    grid = None
    if world is not None:
        # Megatron's rank order: tp fastest, then cp, dp, pp slowest; ep carved out of dp
        # (Note [Expert layout] in include/tardelli/distributed/process_grid.h).
        grid = dist.ProcessGrid(world, dist.ParallelDims(tp=cfg.tp, cp=cfg.cp, pp=cfg.pp,
                                                         dp=dp_size, ep=cfg.ep),
                                (["tp-ep-pp"] if cfg.ep > 1 else []) +
                                (["tp-cp-dp"] if precision.active(cfg) else []))
    return world, dp_size, grid


def build_job(cfg, world, grid, dp_size, vocab_size):
    """The model (this rank's chunks, laid out over `grid`), its gradient reduction (DDP,
    ZeRO-3's FSDP or the expert-parallel pair) and optimizer, as a dict: mcfg, chunks, model,
    named, groups, mp_group, expert_group, ddp, fsdp, opt."""
    from .. import distributed as dist
    from ..distributed.model_parallel import parallelize
    from ..distributed import pipeline_parallel as pipe_mod
    mcfg = model_config(cfg, vocab_size)
    # Note [Parallelize step]: the model (or this rank's pipeline chunks) is built from the
    # seed with every parameter drawn from its own named stream, then each rank keeps its
    # tensor-parallel shards: the same seed gives the same logical model for every layout.
    if cfg.pp > 1:
        layout = [int(x) for x in cfg.pipeline_layout.split(",")] if cfg.pipeline_layout \
            else None
        chunks = pipe_mod.build_stages(mcfg, grid.coords.pp, cfg.pp, cfg.vpp, layout)
    else:
        chunks = [td.models.GPT(mcfg)]
    if cfg.tp > 1 or cfg.cp > 1:
        for ch in chunks:
            parallelize(ch, grid, sequence_parallel=cfg.sequence_parallel,
                        make_vocab_size_divisible_by=cfg.make_vocab_size_divisible_by,
                        cp_comm=cfg.cp_comm)
    if cfg.ep > 1:
        for ch in chunks:
            dist.expert_parallel(ch, grid.ep())
    for ch in chunks:
        # Recomputation is a training-time choice, not part of the model or its checkpoints.
        ch.set_recompute(cfg.recompute, cfg.recompute_layers or None)
        ch.train()
        if cfg.device != "cpu":
            ch.to(cfg.device)
    model = chunks[0]
    # FP8 scalings and per-layer precision of the block linears (docs/fp8.md).
    prec = precision.Precision(cfg, chunks, precision.precision_group(grid, cfg),
                               grid.pp() if cfg.pp > 1 else None)
    # Expert parallelism: the experts' part of the gradient norm is summed over tp-ep-pp
    # (Note [Expert gradients] in python/tardelli/distributed/expert_parallel.py).
    expert_group = grid.group("tp-ep-pp") if cfg.ep > 1 else None
    named = [(n, p) for ch in chunks for n, p in ch.named_parameters()]
    groups = [{"params": [p for ch in chunks for p in ch.param_groups(cfg.weight_decay)[i]
                          ["params"]], "weight_decay": cfg.weight_decay if i == 0 else 0.0}
              for i in range(2)]
    mp_group = None
    if cfg.tp > 1 or cfg.pp > 1:
        mp_group = grid.group("tp-pp") if cfg.pp > 1 else grid.tp()
    ddp = fsdp = None

    def reduction_group(axes):
        """The group a gradient reduction runs over: grid.group(axes), two-level with
        --hierarchical-reduce (Note [Two-level collectives])."""
        g = grid.group(axes)
        if not cfg.hierarchical_reduce:
            return g
        rpn = cfg.ranks_per_node or dist.ranks_per_node_from_env(world.size)
        return dist.hierarchical(g, grid.group_ranks(axes), rpn)

    def compressor():
        """A fresh compressor for one DDP (Note [Error feedback] in include/tardelli/
        distributed/grad_compression.h), or None."""
        if cfg.grad_compression == "powersgd":
            return dist.powersgd_compressor(cfg.powersgd_rank, cfg.seed)
        if cfg.grad_compression in ("topk", "randomk"):
            return dist.topk_compressor(cfg.topk_ratio, cfg.grad_compression == "randomk",
                                        cfg.seed)
        return None

    if world is not None and cfg.zero == 3:
        # ZeRO-3: parameters sharded over dp between uses, gathered per block (fully_sharded.h).
        fsdp = dist.FullyShardedDataParallel(chunks, group=reduction_group("dp"))
        ddp = fsdp.ddp
    elif world is not None and cfg.ep > 1:
        # Dense gradients averaged over dp, the experts' over edp with 1/ep (Note [Expert
        # gradients]).
        ddp = dist.ExpertDataParallel(
            named, reduction_group("dp"), reduction_group("edp"), cfg.ep,
            bucket_mb=cfg.ddp_bucket_mb, zero=cfg.zero,
            own_bucket=("wte.weight",) if cfg.zero == 2 and cfg.pp > 1 else (),
            compressor=compressor if cfg.grad_compression != "none" else None)
    elif world is not None:
        # Note [Data parallel step]: gradients live in the DDP's buckets (param.grad are views
        # into them, never set to None); a bucket's reduction starts as soon as backward has
        # produced its last gradient, and only on the last micro-batch of a step (ZeRO-2: on
        # every micro-batch, into persistent gradient shards). Context parallelism: replicated
        # parameters see only this rank's tokens, so their gradients are averaged over dp x cp
        # (Note [Context-parallel loss] in include/tardelli/parallel/context_parallel.h).
        ddp = dist.DistributedDataParallel(
            named, group=reduction_group("dp-cp" if cfg.cp > 1 else "dp"),
            bucket_mb=cfg.ddp_bucket_mb,
            zero=cfg.zero, own_bucket=("wte.weight",) if cfg.zero == 2 and cfg.pp > 1 else (),
            compressor=compressor())
    if cfg.zero and cfg.ep > 1:
        opt = dist.ExpertDistributedOptimizer(ddp, groups, lr=cfg.lr,
                                              betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                              offload=cfg.offload_optimizer)
        opt.set_expert_parallel(chunks, expert_group)
        if mp_group is not None:
            opt.set_model_parallel(chunks, mp_group)
    elif cfg.zero:
        opt = dist.DistributedOptimizer(fsdp or ddp, groups, lr=cfg.lr,
                                        betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                        offload=cfg.offload_optimizer)
        if mp_group is not None:
            opt.set_model_parallel(chunks, mp_group)
    else:
        opt = td.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    return {"mcfg": mcfg, "chunks": chunks, "model": model, "named": named, "groups": groups,
            "mp_group": mp_group, "expert_group": expert_group, "ddp": ddp, "fsdp": fsdp,
            "opt": opt, "precision": prec}


def train(cfg, world=None, out=print):
    """Runs one training job; returns the summary dict (also printed as the last line on rank
    0). `world`: the communicator of a data-parallel job (join_world()), None for one process."""
    from .. import distributed as dist
    from ..distributed.model_parallel import clip_grad_norm_ as tp_clip_grad_norm_
    from ..distributed import pipeline_parallel as pipe_mod
    world, dp_size, grid = setup_layout(cfg, world)
    size = world.size if world is not None else 1
    attempt = supervisor.attempt()
    if attempt is not None and not (cfg.resume and cfg.save):
        raise C.ConfigError("under python -m tardelli.launch --max-restarts the job restarts "
                            "from its latest checkpoint: give --save DIR --resume")
    dp_rank = grid.coords.dp if grid is not None else 0
    is_main = world is None or world.rank == 0
    # Every tp/cp/pp rank of a replica reads the same samples (a cp rank keeps its tokens).
    data = Data(cfg, dp_rank, dp_size, grid.cp() if cfg.cp > 1 else None)
    job = build_job(cfg, world, grid, dp_size, data.vocab_size)
    mcfg, chunks, model, opt = job["mcfg"], job["chunks"], job["model"], job["opt"]
    named, ddp, fsdp = job["named"], job["ddp"], job["fsdp"]
    mp_group, expert_group = job["mp_group"], job["expert_group"]
    prec = job["precision"]
    moe = mcfg.num_experts > 0  # cp and sequence parallelism are refused (config.validate_moe)
    dp_group = grid.dp() if grid is not None else None
    pp_group = grid.pp() if cfg.pp > 1 else None
    # The gradient compressors (their error feedback is checkpointed per rank).
    compressors = [p.compressor for p in ddp_parts(ddp) if p.compressor is not None]
    lr_at = schedule(cfg)
    # Note [fp16 loss scaling]: fp16 activations need the loss scaled up before backward; the
    # scaler (C++ optim/loss_scaler.h, torch's GradScaler rules) skips a step whose gradients
    # hold inf/nan on any rank: found from the total gradient norm, which every rank already
    # agrees on (Note [Overflow from the norm]).
    scaler = None
    if cfg.dtype == "fp16":
        scaler = _C.DynamicLossScaler(init_scale=cfg.initial_loss_scale,
                                      growth_interval=cfg.loss_scale_window)
    injected = C.inject_steps(cfg)
    world_rank = world.rank if world is not None else 0
    injected_loss = {s for s, r in C.inject_loss_steps(cfg) if r in (-1, world_rank)}
    slow_s = slow_rank_seconds(world_rank)
    accum = C.accumulation_steps(cfg, dp_size)
    global_batch = cfg.micro_batch_size * dp_size * accum
    pipe = None
    if cfg.pp > 1:
        pipe = pipe_mod.PipelineRuntime(chunks, grid, cfg.schedule, accum, cfg.micro_batch_size,
                                        cfg.seq_len // cfg.cp)
        pipe.sync_tied_grads = cfg.zero < 2

    start_step, consumed = 0, 0
    resumed_from, resharded = None, False
    skips = consecutive = 0  # steps skipped for non-finite values: all, and the latest run
    if cfg.resume:
        latest = td.checkpoint.find_latest(cfg.save)
        if latest is None and attempt is None:
            # Nothing to resume is a mistake (a wrong --save, or every save incomplete), except
            # under a supervisor, whose first attempt starts the run it will later resume.
            there = sorted(os.listdir(cfg.save)) if os.path.isdir(cfg.save) else None
            raise C.ConfigError(
                f"--resume: no complete checkpoint under {cfg.save} (" +
                ("the directory does not exist" if there is None else
                 "it is empty" if not there else "it holds " + ", ".join(there[:8]) +
                 (", ..." if len(there) > 8 else "") +
                 "; a *.tmp directory is a save that never completed") +
                "); drop --resume to start a new run")
        if latest is None:
            if is_main:
                out(f"train: --resume: no checkpoint under {cfg.save} yet (supervised attempt "
                    f"{attempt}); starting from scratch")
        else:
            info = ckpt.load(latest, chunks if cfg.pp > 1 else model, opt, cfg, world, fsdp,
                             compressors)
            if info["error_feedback_reset"] and is_main:
                out("train: --resume at another layout: the gradient compressors' error "
                    "feedback starts at zero")
            start_step, consumed = info["step"], info["consumed_samples"]
            resharded = info["resharded"]
            resumed_from = latest
            if info["nonfinite"] is not None:
                skips, consecutive = info["nonfinite"]["skips"], info["nonfinite"]["consecutive"]
            if scaler is not None and info["loss_scaler"] is not None:
                scaler.load_state_dict(info["loss_scaler"])
    loader = data.train_loader(consumed)

    n_params = sum(ch.num_parameters() for ch in chunks)
    flops_per_step = sum(ch.flops_per_step(global_batch, cfg.seq_len) for ch in chunks)
    if cfg.pp > 1:
        # Every stage counts its own part; the tied gpt2 table's pipeline copy once only.
        n_params = int(_sum_over_group(n_params, grid.pp()))
        flops_per_step = _sum_over_group(flops_per_step, grid.pp())
        if cfg.arch == "gpt2":
            n_params -= mcfg.vocab_size * mcfg.d_model
    peak = gemm_peak_flops({"fp32": td.float32, "bf16": td.bfloat16,
                            "fp16": td.float16}[cfg.dtype], cfg.device) * size
    mem_device = td.device(cfg.device)
    if is_main:
        out(f"train: {cfg.arch} {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, "
            f"vocab {data.vocab_size}, {n_params / 1e6:.2f}M parameters, {cfg.dtype}; "
            f"global batch {global_batch} x {cfg.seq_len} tokens ({accum} micro-batches of "
            f"{cfg.micro_batch_size} x dp {dp_size}{f', ZeRO-{cfg.zero}' if cfg.zero else ''}"
            f"{' + optimizer offload' if cfg.offload_optimizer else ''}"
            f"{f', tp {cfg.tp}' if cfg.tp > 1 else ''}"
            f"{' + sequence parallel' if cfg.sequence_parallel else ''}"
            f"{f', cp {cfg.cp} ({cfg.cp_comm})' if cfg.cp > 1 else ''}"
            f"{f', pp {cfg.pp} ({cfg.schedule}, vpp {cfg.vpp})' if cfg.pp > 1 else ''}"
            f"{f', ep {cfg.ep}' if cfg.ep > 1 else ''}); "
            f"GEMM peak {peak / 1e9:.0f} GFLOP/s")
        if resumed_from:
            out(f"train: resumed from {resumed_from} at step {start_step} "
                f"({consumed} samples consumed"
                f"{'; resharded from another layout' if resharded else ''})")
    # Note [Supervised metrics]: a restarted attempt appends to the metrics file instead of
    # trimming it, after a restart event row, so the file holds every attempt's rows; the
    # effective history is the last row of each step (report.effective_rows).
    saver = ckpt.AsyncSaver(world) if cfg.async_save and cfg.save else None
    metrics = report.MetricsFile(cfg.metrics_file if is_main else "",
                                 resume_step=start_step if cfg.resume else None,
                                 append=bool(attempt))
    if attempt:
        metrics.write({"event": "restart", "attempt": attempt, "step": start_step,
                       "cause": supervisor.restart_cause()})
    rank = world.rank if world is not None else 0
    supervisor.heartbeat(rank, start_step)  # built and resumed: the first step may start
    progress = report.Progress(cfg.steps, start_step, cfg.progress and is_main)

    def report_commit(path):
        """Logs a background save that has just been committed (path None: none was)."""
        if path and is_main:
            progress.write(f"train: saved {path} (in the background)")
    params = [p for _, p in named]

    def grad_norm_clipped(max_norm):
        """The global gradient norm (over every rank's shard or model-parallel part); the
        gradients are clipped to max_norm first when it is finite (inf: only measured)."""
        if cfg.zero:
            return opt.clip_grad_norm(max_norm) if math.isfinite(max_norm) else opt.grad_norm()
        if mp_group is not None or expert_group is not None:
            return tp_clip_grad_norm_(chunks, max_norm, mp_group, expert_group)
        return td.nn.utils.clip_grad_norm_(params, max_norm).item()

    last, val_loss, t_train = None, None, 0.0
    peak_rank = peak_max_rank = 0  # allocator peaks over the steps: rank 0's, every rank's
    straggler_logged = -math.inf  # the last step that logged a straggler
    # Note [Straggler report]: each step, every rank splits its step time into wait (seconds
    # blocked in any of the job's communicators: gradient reductions, tp/cp/ep collectives,
    # pipeline sends and receives, the non-finite agreement) and compute (the rest), and rank 0
    # gathers both (one all-gather over the world, after the timed step). In a synchronous job
    # every rank's step takes as long as the slowest's, so a straggler shows as the rank whose
    # compute is large while the others wait for it. The wait is not the DDP's
    # last_wait_seconds(): that times only the final drain in finish_grad_sync, while with the
    # communicators' consistency check (on by default) a bucket's launch during backward
    # already blocks until every rank has reached it; the fast ranks' waiting would then count
    # as compute (measured: 2 ranks, one sleeping 0.2 s a step, both "computed" 0.21 s). A
    # rank whose compute exceeds --straggler-threshold x the median is logged, at most one
    # step's report per --log-interval steps (the metrics file has every step's numbers).
    comms = job_communicators(grid)
    # Note [Reduction bytes]: the metrics' dp_comm_bytes is what this rank handed to its
    # gradient-reduction communicators in the step (their input bytes), cross_node_bytes the
    # part of it the cross-node step of --hierarchical-reduce carried.
    reduce_comms = reduction_communicators(ddp)
    cross_comms = [c for c in (dist.cross_node_group(g) for g in reduce_comms) if c is not None]
    comms += [c for c in reduce_comms if all(c is not d for d in comms)]
    step = start_step
    try:
        while step < cfg.steps:
            lr = lr_at(step)
            for g in opt.param_groups:
                g["lr"] = lr
            td.reset_peak_memory_stats(mem_device)
            t0, blocked0 = time.perf_counter(), comm_blocked_seconds(comms)
            bytes0, cross0 = comm_bytes(reduce_comms), comm_bytes(cross_comms)
            if ddp is not None:
                ddp.zero_grad()
            for c in compressors:  # Note [Compression warm-up] (grad_compression.h)
                c.active = step >= cfg.compression_start_step
            if moe:
                for ch in chunks:
                    ch.reset_moe_stats()  # the step's statistics: all its micro-batches
            loss_sum = 0.0
            loss_scale = scaler.scale if scaler is not None else 1.0
            # The factor backward is seeded with (x 1/accum below): the loss scale, or inf on
            # a step of --inject-nonfinite-grad.
            backward_seed = loss_scale * (math.inf if step + 1 in injected else 1.0)
            if slow_s:
                time.sleep(slow_s)  # TD_TEST_SLOW_RANK: this rank computes slower
            if pipe is not None:
                # The schedule interleaves the micro-batches' forwards and backwards; the DDP
                # reduction runs once after it (finish_grad_sync).
                batches = [loader.next() for _ in range(accum)]
                with ddp.no_sync(True):
                    loss_sum = pipe.step(batches, loss_scale=backward_seed) * accum
            else:
                for m in range(accum):
                    x, y = loader.next()
                    loss = model(x, y)
                    scaled = loss if accum == 1 and backward_seed == 1.0 else \
                        loss * (backward_seed / accum)
                    if ddp is not None:
                        with ddp.no_sync(m < accum - 1):
                            scaled.backward()
                    else:
                        scaled.backward()
                    loss_sum += loss.item()
            if step + 1 in injected_loss:
                loss_sum = math.nan  # --inject-nonfinite-loss: the gradients stay finite
            if ddp is not None:
                ddp.finish_grad_sync()
                if pipe is not None and cfg.zero >= 2:
                    pipe.sync_tied_embedding_shard(getattr(ddp, "dense", ddp))
            max_norm = cfg.clip_grad if cfg.clip_grad > 0 else math.inf
            applied = True
            if scaler is not None:
                # The norm of the scaled gradients decides the overflow on every rank alike;
                # then one multiply unscales and clips (optim::unscale_clip_factor).
                scaled_norm = grad_norm_clipped(math.inf)
                applied = scaler.update(not math.isfinite(scaled_norm))
                grad_norm = scaled_norm
                if applied:
                    factor = _C.unscale_clip_factor(scaled_norm, loss_scale, max_norm)
                    grad_norm = scaled_norm / loss_scale
                    if cfg.zero:
                        opt.scale_grads_(factor)
                    else:
                        with td.no_grad():
                            for p in params:
                                if p.grad is not None:
                                    p.grad.mul_(factor)
            else:
                grad_norm = grad_norm_clipped(max_norm)
            # Note [Non-finite steps]: every rank must take the same decision, or the replicas
            # part (and the next collective may hang). The gradient norm is global: every rank
            # already holds the same value (Note [fp16 loss scaling]). The loss is this rank's:
            # its mean over ranks (reported below) would turn one rank's nan into nan everywhere
            # (an IEEE sum), but only after the update and, under MoE, after the metrics'
            # collectives; a flag reduced with an int max is exact and independent of how the
            # backend sums floats, so the loss is agreed on explicitly, one all-reduce, only
            # under --on-nonfinite skip (tests/python/test_train_faults.py checks a nan on rank 1
            # only skips both ranks, and does reach rank 0's reported mean). Under --on-nonfinite
            # raise a non-finite gradient norm stops the run before the update and a non-finite
            # mean loss after it (as before the flag existed). Under fp16 a non-finite gradient
            # is the loss scaler's (it skips and backs off, unchanged); only a non-finite loss
            # is ours.
            nonfinite = False
            grad_bad = scaler is None and not math.isfinite(grad_norm)
            if cfg.on_nonfinite == "skip":
                # Every rank joins the all-reduce, whatever its own values.
                loss_bad = _any_over_ranks(not math.isfinite(loss_sum), world)
                nonfinite = grad_bad or loss_bad
                skips += int(nonfinite)
                consecutive = consecutive + 1 if nonfinite else 0
            elif grad_bad:
                # Raise before the update: applied, it would put nan into every parameter.
                raise RuntimeError(f"train: the gradient norm is {grad_norm} at step {step + 1} "
                                   "(diverged; lower --lr, use --clip-grad or --on-nonfinite "
                                   "skip)")
            applied = applied and not nonfinite
            if applied:
                opt.step()
                if moe and mcfg.moe_router_bias_update_rate > 0:
                    for ch in chunks:
                        update_moe_router_bias(ch, dp_group)
            if ddp is None:
                opt.zero_grad(set_to_none=True)
            # Note [Amax reduction]: every rank commits the same amaxes and decisions.
            prec_rec = prec.step()
            if mem_device.type == "cuda":
                td.cuda.synchronize()  # the step's time includes its queued GPU work
            dt = time.perf_counter() - t0
            wait = comm_blocked_seconds(comms) - blocked0  # Note [Straggler report]
            t_train += dt
            step += 1
            rank_compute, rank_wait = gather_step_times(max(dt - wait, 0.0), wait, world)
            moe_rec = {}
            if moe:
                # `loss` stays the cross-entropy, comparable with a dense run's and with
                # val_loss; the auxiliary terms are reported apart (Note [MoE metrics]).
                lm_loss, moe_rec = moe_step_metrics(chunks, loss_sum, accum, dp_group,
                                                    pp_group)
                loss_sum = lm_loss * accum
            rec = {"step": step, "loss": _mean_over_ranks(loss_sum / accum, world), "lr": lr,
                   "grad_norm": grad_norm, "tokens_per_s": global_batch * cfg.seq_len / dt,
                   "time": time.time(),
                   "mfu": flops_per_step / dt / peak,
                   "mem_bytes": td.memory_stats(mem_device)["peak_bytes"]}
            # Memory across layouts: this rank's peak in the step, and the largest over ranks.
            peak_rank = max(peak_rank, rec["mem_bytes"])
            rec["peak_mem_bytes_max_rank"] = _max_over_ranks(rec["mem_bytes"], world)
            peak_max_rank = max(peak_max_rank, rec["peak_mem_bytes_max_rank"])
            rec["rank_compute_s"], rec["rank_wait_s"] = rank_compute, rank_wait
            if reduce_comms:
                rec["dp_comm_bytes"] = comm_bytes(reduce_comms) - bytes0
            if cfg.hierarchical_reduce and reduce_comms:
                rec["cross_node_bytes"] = comm_bytes(cross_comms) - cross0
            for k in ("moe_aux_loss", "moe_z_loss"):
                if k in moe_rec:
                    moe_rec[k] = _mean_over_ranks(moe_rec[k], world)
            rec.update(moe_rec)
            if scaler is not None:
                rec["loss_scale"] = loss_scale
            if prec_rec is not None:
                rec["precision"] = prec_rec
            if scaler is not None or cfg.on_nonfinite == "skip":
                rec["skipped"] = not applied
            if cfg.on_nonfinite == "skip":
                rec["nonfinite_skips"] = skips
            if not math.isfinite(rec["loss"]) and not nonfinite:
                raise RuntimeError(f"train: the loss is {rec['loss']} at step {step} "
                                   "(diverged; lower --lr, use --clip-grad or --on-nonfinite "
                                   "skip)")
            if cfg.eval_interval and (step % cfg.eval_interval == 0 or step == cfg.steps):
                val_loss = evaluate(model, data.valid_loader(), cfg.eval_steps) \
                    if pipe is None else evaluate_pipeline(pipe, chunks, data.valid_loader(),
                                                           cfg.eval_steps)
                if val_loss is not None:
                    val_loss = _mean_over_ranks(val_loss, world)
                    rec["val_loss"] = val_loss
            # The step's checkpoint, before its metrics row so the row carries the time the
            # save blocked training (Note [Async save] in train/state.py: with --async-save
            # only the host snapshot; the files are written in the background).
            exiting = cfg.exit_interval and step % cfg.exit_interval == 0
            give_up = nonfinite and consecutive >= cfg.max_skipped_steps
            if saver is not None:
                report_commit(saver.poll())
            if cfg.save and not give_up and (step == cfg.steps or exiting or
                                             (cfg.save_interval and
                                              step % cfg.save_interval == 0)):
                t_save = time.perf_counter()
                parts = chunks if cfg.pp > 1 else model
                save_args = (cfg.save, step, parts, opt, cfg, mcfg, loader.consumed_samples,
                             data.tokenizer_dir, world, scaler,
                             fsdp.full_parameters() if fsdp is not None else None, grid,
                             {"skips": skips, "consecutive": consecutive}
                             if cfg.on_nonfinite == "skip" else None, compressors)
                if saver is not None:
                    report_commit(saver.wait())  # at most one save in flight
                    path = saver.save(*save_args)
                    note = f"train: saving {path} in the background"
                else:
                    path = ckpt.save(*save_args)
                    note = f"train: saved {path}"
                rec["save_blocked_s"] = time.perf_counter() - t_save
                if is_main:
                    progress.write(note)
            metrics.write(rec)
            progress.update(rec["loss"])
            if is_main and (step % cfg.log_interval == 0 or step == cfg.steps or
                            "val_loss" in rec):
                progress.write(report.format_log_line(rec, cfg.steps))
            slow = stragglers(rank_compute, cfg.straggler_threshold) if is_main else []
            if slow and step - straggler_logged >= cfg.log_interval:
                straggler_logged = step  # at most one report per --log-interval steps
                for r, ratio in slow:
                    progress.write(f"train: straggler rank {r}: compute {rank_compute[r]:.3f} s "
                                   f"is {ratio:.2f} x the median")
            if give_up:
                raise RuntimeError(
                    f"train: step {step}: {consecutive} consecutive steps (steps "
                    f"{step - consecutive + 1}-{step}) skipped for a non-finite loss or gradient "
                    f"norm, the limit of --max-skipped-steps {cfg.max_skipped_steps} (diverged; "
                    "lower --lr or use --clip-grad)")
            last = rec
            supervisor.heartbeat(rank, step)
            if exiting:
                break
        if saver is not None:
            report_commit(saver.wait())  # the exit path commits the save in flight
        supervisor.heartbeat(rank, step, done=True)
    finally:
        progress.close()
        metrics.close()

    summary = {"event": "train_end", "step": step, "params": n_params, "dp": dp_size,
               "tp": cfg.tp, "pp": cfg.pp, "cp": cfg.cp, "ep": cfg.ep,
               "local_params": sum(ch.local_num_parameters() for ch in chunks),
               "device": cfg.device,
               "comm_backend": world.backend if world is not None else None,
               "tokens_per_s": (step - start_step) * global_batch * cfg.seq_len /
               max(t_train, 1e-9)}
    if last is not None:
        summary.update(loss=last["loss"], mfu=flops_per_step * (step - start_step) /
                       max(t_train, 1e-9) / peak, peak_mem_bytes=peak_rank,
                       peak_mem_bytes_max_rank=peak_max_rank,
                       mem_current_bytes=td.memory_stats(mem_device)["current_bytes"])
        if cfg.zero:
            summary["zero"] = cfg.zero
            summary["optimizer_state_bytes"] = opt.optimizer_state_bytes()
            summary["host_state_bytes"] = opt.host_state_bytes()
            summary["grad_buffer_bytes"] = sum(p._cpp.grad_buffer_bytes()
                                               for p in ddp_parts(ddp))
    if moe:
        summary["num_experts"] = mcfg.num_experts
        layers = sum(ch.num_moe_layers for ch in chunks)
        summary["moe_layers"] = int(_sum_over_group(layers, pp_group)) if pp_group else layers
        summary["moe_bias_replicated"] = _moe_bias_replicated(chunks, dp_group)
    if cfg.on_nonfinite == "skip":
        summary["nonfinite_skips"] = skips
    if prec.report:
        codes = prec.codes or []
        summary["precision"] = {p: codes.count(c) for p, c in
                                (("fp8", 1), ("bf16", 2), ("fp32", 3))}
        summary["precision_replicated"] = prec.replicated(world)
    if scaler is not None:
        summary["loss_scale"] = scaler.scale
        summary["skipped_steps"] = scaler.skipped_steps
    if val_loss is not None:
        summary["val_loss"] = val_loss
    if pipe is not None and last is not None:
        # The last step's measured timeline on every pp rank (a collective over the pp group).
        from ..distributed import pipeline as sched
        timelines = pipe.gather_timelines()
        summary["schedule"] = cfg.schedule
        summary["microbatches"] = accum
        summary["bubble_fraction"] = sched.bubble_fraction(timelines)
        summary["bubble_formula"] = sched.bubble_formula(cfg.schedule, cfg.pp, accum, cfg.vpp)
        # Each stage's peak memory in the last step (stage = pp rank; on tp/dp rank 0 of it).
        peaks = td.zeros(cfg.pp, dtype=td.int64)
        grid.pp().all_gather(peaks, td.tensor([int(last["mem_bytes"])], dtype=td.int64))
        summary["stage_peak_mem_bytes"] = [int(x) for x in peaks.tolist()]
        if is_main and cfg.trace:
            sched.write_chrome_trace(cfg.trace, timelines)
            png = os.path.splitext(cfg.trace)[0] + ".png"
            if sched.have_matplotlib():
                sched.plot_timeline(png, timelines, f"{cfg.schedule}, pp {cfg.pp}, "
                                    f"{accum} micro-batches")
                summary["trace_png"] = png
            summary["trace"] = cfg.trace
    if is_main and cfg.metrics_file:
        png = os.path.join(cfg.save, "loss.png") if cfg.save else \
            os.path.splitext(cfg.metrics_file)[0] + ".png"
        drawn, why = report.plot_loss_isolated(cfg.metrics_file, png,
                                               f"{cfg.arch} {n_params / 1e6:.1f}M")
        if drawn:
            summary["loss_curve"] = png
        elif "not installed" not in why:
            out(f"train: {why}")
    if is_main:
        out(json.dumps(summary))
    return summary
