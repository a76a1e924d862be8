"""Tensor-parallel layers (Megatron-core's tensor_parallel/layers.py) as td.nn modules.

    import tardelli as td
    import tardelli.distributed as dist

    dist.init()                                   # under `python -m tardelli.launch --nproc 2`
    td.manual_seed(0)                             # the same seed on every rank
    fc1 = dist.ColumnParallelLinear(64, 256)      # weight [256 / tp, 64]
    fc2 = dist.RowParallelLinear(256, 64)         # weight [64, 256 / tp], bias [64] replicated
    y = fc2(td.nn.functional.gelu(fc1(x)))        # == the dense MLP; one all-reduce

Layout-independent init (Note [Layout-independent init] in tensor_parallel.h): each layer draws
the FULL weight exactly as td.nn.Linear / td.nn.Embedding would (same init functions, same order,
from `generator` or the default generator) and keeps its rank's slice. So after the same
td.manual_seed on every rank, the tp ranks together hold exactly the layer that td.nn.Linear
would have drawn, whatever the tp degree; `from_full(layer, group)` slices an existing one.

`group=None` means the world (td.distributed.init()). Every rank of the group must make the same
calls in the same order. The math lives in C++ (tardelli._C.parallel); this file holds state.
"""
import math

from .. import _C
from ..nn import init
from ..nn.modules import Module, _empty
from ..nn.parameter import Parameter

# (getattr: an extension module built before tardelli._C.parallel existed still imports; the
# layers then fail on first use.)
_P = getattr(_C, "parallel", None)
RngTracker = getattr(_P, "RngTracker", None)
DEFAULT_RNG = "default"                      # rng_tracker.h's kDefaultRng
MODEL_PARALLEL_RNG = "model-parallel-rng"    # and kModelParallelRng


def _group(group):
    if group is not None:
        return group
    from . import world
    return world()


def _error(msg):
    return _C.TardelliError(msg)


def _check_divisible(layer, what, n, group):
    if n % group.size != 0:
        raise _error(f"{layer}: {what} {n} is not divisible by the tensor-parallel size "
                     f"{group.size} (group '{group.name}')")


def _check_last_dim(layer, x, want, what):
    if x.dim() < 1 or x.shape[-1] != want:
        raise _error(f"{layer}.forward: input of shape {list(x.shape)} must have last dim {want} "
                     f"({what})")


def _draw_linear(in_features, out_features, bias, generator, device, dtype):
    """The full (weight, bias) exactly as td.nn.Linear(in, out, bias).reset_parameters draws
    them, from `generator` (None: the default generator)."""
    w = _empty((out_features, in_features), dtype, device)
    init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
    b = None
    if bias:
        b = _empty((out_features,), dtype, device)
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
        init.uniform_(b, -bound, bound, generator=generator)
    return w, b


def _detached(t):
    return None if t is None else t.detach()


class ColumnParallelLinear(Module):
    """y = x W^T + b with W [out_features, in_features] split by rows over `group`.

    weight [out/tp, in] and bias [out/tp] are this rank's rows. The output is this rank's
    [..., out/tp] columns, or the full [..., out] with gather_output. With sequence_parallel the
    input is this rank's chunk of dim seq_dim and is all-gathered first (not with
    gather_output).
    """

    def __init__(self, in_features, out_features, bias=True, gather_output=False,
                 sequence_parallel=False, seq_dim=0, group=None, generator=None, device=None,
                 dtype=None, _full=None):
        super().__init__()
        group = _group(group)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        self.seq_dim = seq_dim
        self.group = group
        _check_divisible("ColumnParallelLinear", "out_features", out_features, group)
        if gather_output and sequence_parallel:
            raise _error("ColumnParallelLinear: gather_output and sequence_parallel cannot be "
                         "combined (the output of a sequence-parallel column layer stays split "
                         "along its last dim)")
        if _full is None:
            _full = _draw_linear(in_features, out_features, bias, generator, device, dtype)
        w, b = _full
        self.weight = Parameter(_P.shard_rows(w, group.rank, group.size))
        if b is not None:
            self.bias = Parameter(_P.shard_rows(b, group.rank, group.size))
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_full(cls, linear, group=None, gather_output=False, sequence_parallel=False,
                  seq_dim=0):
        """This rank's shard of an existing td.nn.Linear (copied; its bias decides ours)."""
        out_features, in_features = linear.weight.shape
        return cls(in_features, out_features, linear.bias is not None, gather_output,
                   sequence_parallel, seq_dim, group,
                   _full=(linear.weight.detach(), _detached(linear.bias)))

    @property
    def tp_size(self):
        return self.group.size

    @property
    def tp_rank(self):
        return self.group.rank

    def forward(self, input):  # noqa: A002
        _check_last_dim("ColumnParallelLinear", input, self.in_features, "in_features")
        return _P.column_parallel_linear(input, self.weight, self.bias, self.group,
                                         self.gather_output, self.sequence_parallel, self.seq_dim)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(/{self.group.size} per rank), bias={self.bias is not None}, "
                f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(Module):
    """y = x W^T + b with W [out_features, in_features] split by columns over `group`.

    weight [out, in/tp] holds this rank's columns; bias [out] is replicated and added once after
    the reduction. input_is_parallel: the input is this rank's [..., in/tp] slice (a
    column-parallel output); otherwise the full input, split here. The output is the full
    [..., out] (all-reduced), or with sequence_parallel this rank's chunk of dim seq_dim
    (reduce-scattered; requires input_is_parallel).
    """

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True,
                 sequence_parallel=False, seq_dim=0, group=None, generator=None, device=None,
                 dtype=None, _full=None):
        super().__init__()
        group = _group(group)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.seq_dim = seq_dim
        self.group = group
        _check_divisible("RowParallelLinear", "in_features", in_features, group)
        if sequence_parallel and not input_is_parallel:
            raise _error("RowParallelLinear: sequence_parallel requires input_is_parallel "
                         "(as in Megatron)")
        if _full is None:
            _full = _draw_linear(in_features, out_features, bias, generator, device, dtype)
        w, b = _full
        self.weight = Parameter(_P.shard_cols(w, group.rank, group.size))
        if b is not None:
            self.bias = Parameter(b.detach().clone())
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_full(cls, linear, group=None, input_is_parallel=True, sequence_parallel=False,
                  seq_dim=0):
        """This rank's shard of an existing td.nn.Linear (copied; its bias decides ours)."""
        out_features, in_features = linear.weight.shape
        return cls(in_features, out_features, linear.bias is not None, input_is_parallel,
                   sequence_parallel, seq_dim, group,
                   _full=(linear.weight.detach(), _detached(linear.bias)))

    @property
    def tp_size(self):
        return self.group.size

    @property
    def tp_rank(self):
        return self.group.rank

    def forward(self, input):  # noqa: A002
        if self.input_is_parallel:
            _check_last_dim("RowParallelLinear", input, self.in_features // self.group.size,
                            "this rank's slice of in_features: input_is_parallel")
        else:
            _check_last_dim("RowParallelLinear", input, self.in_features, "in_features")
        return _P.row_parallel_linear(input, self.weight, self.bias, self.group,
                                      self.input_is_parallel, self.sequence_parallel,
                                      self.seq_dim)

    def extra_repr(self):
        return (f"in_features={self.in_features} (/{self.group.size} per rank), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}, "
                f"sequence_parallel={self.sequence_parallel}")


class VocabParallelEmbedding(Module):
    """A lookup table [num_embeddings, embedding_dim] padded with zero rows to padded_vocab
    (padded_vocab_size(num_embeddings, tp, make_divisible_by)) and split by rows over `group`:
    weight [padded_vocab/tp, dim] holds ids [vocab_start, vocab_end). The output [..., dim] is
    replicated, or with sequence_parallel this rank's chunk of dim seq_dim of the ids. Ids
    outside [0, num_embeddings) raise, as in td.nn.Embedding: the padding is never looked up.
    """

    def __init__(self, num_embeddings, embedding_dim, sequence_parallel=False, seq_dim=0,
                 make_divisible_by=128, group=None, generator=None, device=None, dtype=None,
                 _weight=None):
        super().__init__()
        group = _group(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.sequence_parallel, self.seq_dim = sequence_parallel, seq_dim
        self.make_divisible_by = make_divisible_by
        self.group = group
        if num_embeddings <= 0 or make_divisible_by <= 0:
            raise _error(f"VocabParallelEmbedding: num_embeddings ({num_embeddings}) and "
                         f"make_divisible_by ({make_divisible_by}) must be > 0")
        if _weight is None:
            _weight = _empty((num_embeddings, embedding_dim), dtype, device)
            init.normal_(_weight, generator=generator)  # as td.nn.Embedding.reset_parameters
        self.padded_vocab = _P.padded_vocab_size(num_embeddings, group.size, make_divisible_by)
        self.vocab_start, self.vocab_end = _P.vocab_range(self.padded_vocab, group.rank,
                                                          group.size)
        self.weight = Parameter(_P.shard_vocab_rows(_weight, self.padded_vocab, group.rank,
                                                    group.size))

    @classmethod
    def from_full(cls, embedding, group=None, sequence_parallel=False, seq_dim=0,
                  make_divisible_by=128):
        """This rank's rows of an existing td.nn.Embedding's table (copied)."""
        num_embeddings, embedding_dim = embedding.weight.shape
        return cls(num_embeddings, embedding_dim, sequence_parallel, seq_dim, make_divisible_by,
                   group, _weight=embedding.weight.detach())

    @property
    def tp_size(self):
        return self.group.size

    @property
    def tp_rank(self):
        return self.group.rank

    def forward(self, input):  # noqa: A002
        if input.is_floating_point():
            raise _error(f"VocabParallelEmbedding: ids must be int32 or int64, got {input.dtype}")
        if input.numel() > 0:
            lo, hi = int(input.min().item()), int(input.max().item())
            if lo < 0 or hi >= self.num_embeddings:
                raise _error(f"VocabParallelEmbedding: ids must be in [0, {self.num_embeddings}), "
                             f"got values in [{lo}, {hi}]")
        return _P.vocab_parallel_embedding(input, self.weight, self.group, self.vocab_start,
                                           self.sequence_parallel, self.seq_dim)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}, padded_vocab={self.padded_vocab}, "
                f"rows [{self.vocab_start}, {self.vocab_end}), "
                f"sequence_parallel={self.sequence_parallel}")


def padded_vocab_size(vocab_size, tp_size=None, make_divisible_by=128):
    """The smallest multiple of make_divisible_by * tp_size >= vocab_size (Megatron's
    --make-vocab-size-divisible-by). tp_size: an int or a group (None: the world's size)."""
    if tp_size is None or not isinstance(tp_size, int):
        tp_size = _group(tp_size).size
    return _P.padded_vocab_size(vocab_size, tp_size, make_divisible_by)


def vocab_parallel_cross_entropy(input, target, vocab_size=None, group=None,  # noqa: A002
                                 ignore_index=-100, reduction="mean"):
    """Cross-entropy of logits split over the vocabulary, without gathering them.

    input [..., V_pad/tp]: this rank's logit columns [rank * V_pad/tp, (rank + 1) * V_pad/tp)
    (e.g. a ColumnParallelLinear output, or h @ VocabParallelEmbedding.weight^T); target [...]
    (replicated) holds ids in [0, vocab_size) or ignore_index. vocab_size: the true vocabulary
    (columns >= it are padding and never change the loss); None: no padding. reduction: 'none',
    'mean' (over the tokens not ignored) or 'sum'. Equals td.nn.functional.cross_entropy of the
    unpadded full logits, on every rank.
    """
    g = _group(group)
    shard = input.shape[-1]
    if vocab_size is None:
        vocab_size = shard * g.size
    return _P.vocab_parallel_cross_entropy(input, target, g, g.rank * shard, vocab_size,
                                           ignore_index, reduction)


def column_parallel_linear(input, weight, bias=None, group=None, gather_output=False,  # noqa: A002
                           sequence_parallel=False, seq_dim=0):
    """The functional ColumnParallelLinear: weight/bias are this rank's shards."""
    return _P.column_parallel_linear(input, weight, bias, _group(group), gather_output,
                                     sequence_parallel, seq_dim)


def row_parallel_linear(input, weight, bias=None, group=None, input_is_parallel=True,  # noqa: A002
                        sequence_parallel=False, seq_dim=0):
    """The functional RowParallelLinear: weight is this rank's shard, bias the full one."""
    return _P.row_parallel_linear(input, weight, bias, _group(group), input_is_parallel,
                                  sequence_parallel, seq_dim)


__all__ = ["ColumnParallelLinear", "DEFAULT_RNG", "MODEL_PARALLEL_RNG", "RngTracker",
           "RowParallelLinear", "VocabParallelEmbedding", "column_parallel_linear",
           "padded_vocab_size", "row_parallel_linear", "vocab_parallel_cross_entropy"]
