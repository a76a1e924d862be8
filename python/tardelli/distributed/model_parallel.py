"""The parallelize step for the fused GPT (include/tardelli/parallel/parallelize.h).

    grid = dist.ProcessGrid(dist.world(), dist.ParallelDims(tp=2, dp=dist.world_size() // 2))
    model = td.models.GPT(cfg)                    # full weights from cfg.seed on every rank
    dist.parallelize(model, grid, sequence_parallel=True)
    ddp = dist.DistributedDataParallel(model, group=grid.dp())

The model is written once, without parallelism; this step replaces each parameter by this
rank's shard of it (model.shard_spec(name) says where it lies in the full tensor) and makes
forward/backward run Megatron's tensor-parallel collectives over the tp group. Every rank of a
tp group must pass it the same data. Gradient-norm clipping must then count sharded parameters
on every tp rank and replicated ones once: use td.distributed.clip_grad_norm_ (or the
DistributedOptimizer built with the model).
"""
import math

from .. import _C


def parallelize(model, grid=None, *, tp=None, cp=None, sequence_parallel=False,
                make_vocab_size_divisible_by=128, cp_comm="ring"):
    """Lays `model` (a td.models.GPT, or one pipeline stage of it, fresh from its constructor)
    out over `grid` (a ProcessGrid: its tp and cp groups) or over the communicators `tp` (and
    optionally `cp`). Returns the model. Groups of size 1 leave the model as it is.

    Context parallelism (cp > 1): the model's inputs are then this rank's zigzag tokens of each
    sequence (context_parallel_slice), attention runs over the cp group (`cp_comm` "ring" or
    "a2a") and the loss is the cp group's mean; gradients must be averaged over the dp x cp
    group (DistributedDataParallel(..., group=grid.dp_cp()))."""
    if (grid is None) == (tp is None):
        raise TypeError("parallelize: pass exactly one of grid= (a ProcessGrid) or tp= (a "
                        "communicator)")
    if grid is not None:
        # Pipeline stages are built by td.distributed.pipeline_parallel.build_stages; this step
        # lays each stage out over the tp and cp groups.
        tp, cp = grid.tp(), grid.cp()
    if not hasattr(model, "_cpp"):
        raise TypeError(f"parallelize: expected a td.models.GPT, got {type(model).__name__}")
    if cp is None or cp.size == 1:
        _C.parallel.apply_tensor_parallel(model._cpp, tp, bool(sequence_parallel),
                                          int(make_vocab_size_divisible_by))
    else:
        _C.parallel.apply_parallelism(model._cpp, tp, cp, bool(sequence_parallel),
                                      int(make_vocab_size_divisible_by), str(cp_comm))
    model._mirror_parameters()
    return model


def context_parallel_slice(x, cp, dim=1):
    """This rank's zigzag part (chunks r and 2N-1-r of 2N) of a full [B, T, ...] tensor `x`
    along `dim`, for the cp group `cp` (a communicator or None)."""
    if cp is None or cp.size == 1:
        return x
    return _C.parallel.zigzag_slice(x, dim, cp.rank, cp.size)


def is_tensor_parallel(model, name):
    """Whether parameter `name` of `model` is split over its tp group (not replicated)."""
    return model.shard_spec(name)["dim"] >= 0 and model.tp_size > 1


def _sum_over(value, group):
    """Sums a Python float over `group`, the same bits on every rank (Note [Norm exchange] in
    include/tardelli/distributed/collectives.h)."""
    return _C.distributed.sum_over_ranks(float(value), group)


def _counts(model, name, tp):
    """Whether parameter `name` of `model` counts in the global norm on this rank: split over tp,
    or replicated and this is tp rank 0; a pipeline stage's copy of the tied embedding counts on
    the first stage only."""
    if name == "wte.weight" and not model.stage[2]:
        return False
    return is_tensor_parallel(model, name) or not tp or model.tp_rank == 0


def grad_norm_squared(model, group=None, expert_group=None):
    """The squared L2 norm of the full model's gradient under a model-parallel layout. `model`
    is a td.models.GPT or a list of this rank's pipeline chunks; `group` the model-parallel
    group (the tp group, or the tp-pp group with pipelining). Split parameters count on every
    tp rank, replicated ones on tp rank 0 only, the tied embedding's pipeline copy not at all;
    the per-rank sums are added over `group`. Under expert parallelism the experts' squares are
    added over `expert_group` instead (the grid's tp-ep-pp group: Note [Expert gradients] in
    expert_parallel.py). A float, the same on every rank of the groups."""
    from .expert_parallel import is_expert_parameter
    models = model if isinstance(model, (list, tuple)) else [model]
    tp = models[0].tp_size > 1
    if group is None and (tp or len(models) > 1 or not models[0].stage[2] or
                          not models[0].stage[3]):
        raise ValueError("grad_norm_squared: a model-parallel model needs its model-parallel "
                         "group")
    if expert_group is None and models[0].ep_size > 1:
        raise ValueError("grad_norm_squared: an expert-parallel model needs its expert group "
                         "(tp-ep-pp) for the experts' part")
    local = local_experts = 0.0
    for m in models:
        for name, p in m.named_parameters():
            if p.grad is None or not _counts(m, name, tp):
                continue
            sq = float((p.grad * p.grad).sum().item())
            if expert_group is not None and is_expert_parameter(name):
                local_experts += sq
            else:
                local += sq
    total = _sum_over(local, group) if group is not None and group.size > 1 else local
    if expert_group is not None:
        total += _sum_over(local_experts, expert_group) if expert_group.size > 1 \
            else local_experts
    return total


def clip_grad_norm_(model, max_norm, group=None, expert_group=None):
    """torch's clip_grad_norm_ for a tensor- (pipeline-, expert-) parallel model: the norm of
    the full model's gradient (grad_norm_squared), and every local gradient scaled by
    max_norm / (norm + 1e-6) when that is below 1. Returns the norm before clipping (a float)."""
    norm = math.sqrt(grad_norm_squared(model, group, expert_group))
    models = model if isinstance(model, (list, tuple)) else [model]
    if math.isfinite(norm) and math.isfinite(max_norm):
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for m in models:
                for p in m.parameters():
                    if p.grad is not None:
                        p.grad.mul_(coef)
    return norm
