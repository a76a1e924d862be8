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
import struct

from .. import _C


def parallelize(model, grid=None, *, tp=None, sequence_parallel=False,
                make_vocab_size_divisible_by=128):
    """Lays `model` (a td.models.GPT fresh from its constructor) out over `grid` (a
    ProcessGrid: its tp group; pp/cp > 1 are refused) or over the communicator `tp`. Returns the
    model. A tp group of size 1 leaves the model as it is."""
    if (grid is None) == (tp is None):
        raise TypeError("parallelize: pass exactly one of grid= (a ProcessGrid) or tp= (a "
                        "communicator)")
    if grid is not None:
        dims = grid.dims
        if dims.pp != 1 or dims.cp != 1:
            raise ValueError(f"parallelize: pipeline (pp={dims.pp}) and context (cp={dims.cp}) "
                             "parallelism are not available for the GPT yet")
        tp = grid.tp()
    if not hasattr(model, "_cpp"):
        raise TypeError(f"parallelize: expected a td.models.GPT, got {type(model).__name__}")
    _C.parallel.apply_tensor_parallel(model._cpp, tp, bool(sequence_parallel),
                                      int(make_vocab_size_divisible_by))
    model._mirror_parameters()
    return model


def is_tensor_parallel(model, name):
    """Whether parameter `name` of `model` is split over its tp group (not replicated)."""
    return model.shard_spec(name)["dim"] >= 0 and model.tp_size > 1


def _sum_over(value, group):
    """Sums a Python float over `group` exactly as the C++ optimizer does (Note [Norm exchange]
    in src/distributed/distributed_optimizer.cpp): the doubles are all-gathered bit for bit and
    added in rank order, so every rank gets the same total."""
    import tardelli as td
    bits = struct.unpack("<q", struct.pack("<d", float(value)))[0]
    out = td.zeros(group.size, dtype=td.int64)
    group.all_gather(out, td.tensor([bits], dtype=td.int64))
    return sum(struct.unpack("<d", struct.pack("<q", int(b)))[0] for b in out.tolist())


def grad_norm_squared(model, group=None):
    """The squared L2 norm of the full model's gradient under a tensor-parallel layout: split
    parameters count on every rank of the tp `group`, replicated ones (identical on all tp
    ranks) on tp rank 0 only, and the per-rank sums are added over the group. A float, the
    same on every tp rank."""
    tp = model.tp_size > 1
    if tp and group is None:
        raise ValueError("grad_norm_squared: a tensor-parallel model needs its tp group")
    first = not tp or group.rank == 0
    local = 0.0
    for name, p in model.named_parameters():
        if p.grad is None or not (is_tensor_parallel(model, name) or first):
            continue
        local += float((p.grad * p.grad).sum().item())
    return _sum_over(local, group) if tp else local


def clip_grad_norm_(model, max_norm, group=None):
    """torch's clip_grad_norm_ for a tensor-parallel model: the norm of the full model's
    gradient (grad_norm_squared), and every local gradient scaled by max_norm / (norm + 1e-6)
    when that is below 1. Returns the norm before clipping (a float)."""
    norm = math.sqrt(grad_norm_squared(model, group))
    if math.isfinite(norm) and math.isfinite(max_norm):
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm
