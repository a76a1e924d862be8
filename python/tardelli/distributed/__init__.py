"""Multi-process training: torch.distributed-style collectives over td communicators.

    import tardelli as td
    import tardelli.distributed as dist

    dist.init()                      # MPI world (run under `python -m tardelli.launch --nproc N`)
    x = td.ones(4)
    dist.all_reduce(x)               # every rank: x == world_size
    grid = dist.ProcessGrid(dist.world(), dist.ParallelDims(tp=2, dp=dist.world_size() // 2))
    y = dist.nn.copy_to_region(x, grid.tp())

The C++ library keeps no global process-group state; this module holds one default group (the
world after init()), like torch.distributed's default group, so that `group=None` means "all
ranks". Everything else is a thin layer over tardelli._C.distributed.
"""
import os as _os

from .. import _api, _C
from . import nn  # noqa: F401
from .data_parallel import DistributedDataParallel, DistributedOptimizer  # noqa: F401,E402
from .data_parallel import FullyShardedDataParallel  # noqa: F401,E402
GradCompressor = _C.distributed.GradCompressor
powersgd_compressor = _C.distributed.powersgd_compressor
topk_compressor = _C.distributed.topk_compressor
from . import tensor_parallel  # noqa: F401,E402
from .tensor_parallel import (  # noqa: F401,E402
    ColumnParallelLinear, RngTracker, RowParallelLinear, VocabParallelEmbedding, padded_vocab_size,
    vocab_parallel_cross_entropy)
from .model_parallel import (clip_grad_norm_, context_parallel_slice,  # noqa: F401,E402
                             grad_norm_squared, parallelize)
from . import pipeline, pipeline_parallel  # noqa: F401,E402
from .expert_parallel import (ExpertDataParallel, ExpertDistributedOptimizer,  # noqa: F401,E402
                              expert_parallel)

_D = _C.distributed
Communicator = _D.Communicator
Work = _D.Work
ParallelDims = _D.ParallelDims
ProcessGrid = _D.ProcessGrid
GridCoords = _D.GridCoords
mpi_available = _D.mpi_available

_world = None  # the default group, set by init()

# Environment variables naming this process's rank under the launchers we support.
_RANK_ENV = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK")
_LOCAL_RANK_ENV = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK")


def _env_int(names):
    for n in names:
        v = _os.environ.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def init(backend="mpi", timeout_s=None, device=None, check_consistency=True):
    """Joins the job: creates the world communicator and makes it the default group.

    backend: "mpi" (CPU tensors) or "nccl" (CUDA tensors; bootstrapped over MPI, on CUDA device
    `device`, default the local rank). timeout_s bounds every blocking wait (default: the
    TD_COMM_TIMEOUT_S environment variable, else 300 s). Works under `python -m tardelli.launch`,
    plain `mpirun -np N python ...` and `srun`; a single process without a launcher is a world of
    one.
    """
    global _world
    if _world is not None:
        raise _C.TardelliError("td.distributed.init: already initialized (call destroy() first)")
    if backend not in ("mpi", "nccl"):
        raise _C.TardelliError(
            f"td.distributed.init: unknown backend '{backend}' (expected 'mpi' or 'nccl')")
    world = _D.mpi_world(timeout_s=timeout_s, check_consistency=check_consistency)
    if backend == "nccl":
        if device is None:
            device = _env_int(_LOCAL_RANK_ENV) or 0
        world = _D.nccl_communicator(world, device, timeout_s=timeout_s)
    _world = world
    return world


def is_initialized():
    return _world is not None


def world():
    """The default group (the world communicator)."""
    if _world is None:
        raise _C.TardelliError(
            "td.distributed: not initialized; call td.distributed.init() first")
    return _world


def _group(group):
    return world() if group is None else group


def rank(group=None):
    return _group(group).rank


def world_size(group=None):
    return _group(group).size


get_rank = rank
get_world_size = world_size


def is_main_process():
    """True on rank 0 (or in a single process): the one that should print and save."""
    if _world is not None:
        return _world.rank == 0
    r = _env_int(_RANK_ENV)
    return r is None or r == 0


def barrier(group=None):
    _group(group).barrier()


def all_reduce(tensor, op="sum", group=None, async_op=False):
    """In place: tensor becomes the reduction over the group ("sum", "avg", "max", "min")."""
    g = _group(group)
    if tensor.is_contiguous():
        return g.all_reduce(tensor, op, async_op)
    tmp = tensor.contiguous()
    g.all_reduce(tmp, op)
    tensor.copy_(tmp)
    return _done(async_op)


def all_gather_into_tensor(output, input, group=None, async_op=False):  # noqa: A002
    """output (group size x input.numel() elements): rank i's input at block i."""
    return _group(group).all_gather(output, input, async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """tensor_list[i] receives rank i's tensor (torch.distributed.all_gather)."""
    g = _group(group)
    if len(tensor_list) != g.size:
        raise _C.TardelliError(
            f"all_gather: tensor_list has {len(tensor_list)} tensors but the group "
            f"'{g.name}' has {g.size} ranks")
    src = tensor.contiguous()
    flat = _api.empty(g.size, *src.shape, dtype=src.dtype, device=src.device)
    work = g.all_gather(flat, src, async_op)

    def scatter_back():
        for i, t in enumerate(tensor_list):
            t.copy_(flat[i])

    if work is None:
        scatter_back()
        return None
    return _ThenWork(work, scatter_back)


def reduce_scatter_tensor(output, input, op="sum", group=None, async_op=False):  # noqa: A002
    """output receives the reduction of block `rank` of input (group size x output.numel())."""
    return _group(group).reduce_scatter(output, input, op, async_op)


def broadcast(tensor, src, group=None, async_op=False):
    """src's tensor is copied into every rank's tensor (src is a rank of `group`)."""
    g = _group(group)
    if tensor.is_contiguous():
        return g.broadcast(tensor, src, async_op)
    tmp = tensor.contiguous()
    g.broadcast(tmp, src)
    tensor.copy_(tmp)
    return _done(async_op)


def send(tensor, dst, group=None, tag=0):
    _group(group).send(tensor, dst, tag)


def recv(tensor, src, group=None, tag=0):
    _group(group).recv(tensor, src, tag)


def isend(tensor, dst, group=None, tag=0):
    return _group(group).send(tensor, dst, tag, True)


def irecv(tensor, src, group=None, tag=0):
    return _group(group).recv(tensor, src, tag, True)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,  # noqa: A002
                      group=None, async_op=False):
    """torch.distributed.all_to_all_single: split sizes count rows along dim 0 (None: equal)."""
    g = _group(group)

    def elements(splits, t):
        if splits is None:
            return []
        row = 1
        for s in t.shape[1:]:
            row *= s
        return [int(s) * row for s in splits]

    return g.all_to_all(output, input, elements(output_split_sizes, output),
                        elements(input_split_sizes, input), async_op)


def split(color, key=None, name=None, group=None):
    """MPI_Comm_split over `group`: ranks with equal color form a new group ordered by key
    (default: the current rank). A negative color returns None. Collective over `group`."""
    g = _group(group)
    if key is None:
        key = g.rank
    return g.split(color, key, name or f"{g.name}.split{color}")


def hierarchical(group, world_ranks, ranks_per_node):
    """A two-level version of `group` (Note [Two-level collectives] in include/tardelli/
    distributed/hierarchical.h): all_reduce, reduce_scatter and all_gather reduce inside each
    node first, so 1/ranks_per_node of the data crosses nodes. `world_ranks`: the members' world
    ranks in group order (ProcessGrid.group_ranks); world rank r runs on node r // ranks_per_node.
    Collective over `group`."""
    return _D.hierarchical(group, _D.nodes_of([int(r) for r in world_ranks],
                                              int(ranks_per_node)))


def cross_node_group(group):
    """The cross-node communicator under a hierarchical group (None otherwise or on a rank that
    does not take part in the cross-node step)."""
    return _D.cross_node_group(group)


def local_rank():
    """This process's rank on its node as the launcher tells it (Open MPI, MPICH, SLURM,
    torchrun-style LOCAL_RANK), else 0."""
    return _env_int(_LOCAL_RANK_ENV) or 0


def device_for_rank(device="cuda"):
    """The device a rank trains on: "cuda" becomes cuda:{local rank % visible devices} (ranks
    beyond the device count share devices, as on a one-GPU test machine); an explicit
    "cuda:N" or "cpu" is kept."""
    if device != "cuda":
        return device
    n = _C.cuda_device_count()
    if n < 1:
        raise _C.TardelliError("device_for_rank: no CUDA device is visible")
    return f"cuda:{local_rank() % n}"


def host_staged(group, stage_host_tensors=False):
    """A communicator over `group` (an MPI one) that also takes CUDA tensors, moving them
    through host memory (include/tardelli/distributed/host_staged.h): for ranks sharing a GPU,
    where NCCL cannot run."""
    return _D.host_staged(group, stage_host_tensors)


def ranks_per_node_from_env(default):
    """Ranks per node as the launcher tells it (Open MPI, MPICH, SLURM), else `default`."""
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"):
        v = _os.environ.get(name, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    return default


def new_group(ranks, name=None, group=None):
    """A group of `ranks` (ranks of `group`, in that order); None on the other ranks.
    Collective over `group`: every rank calls it with the same list."""
    g = _group(group)
    ranks = [int(r) for r in ranks]
    if sorted(set(ranks)) != sorted(ranks) or any(r < 0 or r >= g.size for r in ranks):
        raise _C.TardelliError(
            f"new_group: ranks {ranks} must be distinct ranks of group '{g.name}' (size {g.size})")
    me = g.rank
    color, key = (0, ranks.index(me)) if me in ranks else (-1, 0)
    return g.split(color, key, name or "group" + "_".join(str(r) for r in ranks))


def destroy():
    """Drops the default group and finalizes MPI (after which init() cannot be called again)."""
    global _world
    _world = None
    _D.finalize()


class _DoneWork:
    """The Work of an operation that already completed (async_op on a synchronous path)."""

    def wait(self):
        return None

    def is_completed(self):
        return True


def _done(async_op):
    return _DoneWork() if async_op else None


class _ThenWork:
    """A Work that runs `then` once the underlying operation has completed."""

    def __init__(self, work, then):
        self._work, self._then, self._ran = work, then, False

    def wait(self):
        self._work.wait()
        if not self._ran:
            self._ran = True
            self._then()

    def is_completed(self):
        return self._work.is_completed()


__all__ = [
    "Communicator", "GridCoords", "ParallelDims", "ProcessGrid", "Work", "all_gather",
    "all_gather_into_tensor", "all_reduce", "all_to_all_single", "barrier", "broadcast",
    "destroy", "get_rank", "get_world_size", "init", "irecv", "is_initialized", "is_main_process",
    "isend", "mpi_available", "new_group", "nn", "rank", "recv", "reduce_scatter_tensor", "send",
    "split", "world", "world_size", "parallelize", "clip_grad_norm_", "grad_norm_squared",
    "pipeline", "pipeline_parallel", "tensor_parallel", "ColumnParallelLinear",
    "RowParallelLinear", "VocabParallelEmbedding", "RngTracker", "padded_vocab_size",
    "vocab_parallel_cross_entropy", "DistributedDataParallel", "DistributedOptimizer",
    "FullyShardedDataParallel", "ExpertDataParallel", "ExpertDistributedOptimizer",
    "expert_parallel", "hierarchical", "cross_node_group", "ranks_per_node_from_env",
    "GradCompressor", "powersgd_compressor", "topk_compressor",
]
