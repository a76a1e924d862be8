"""Top-level functions with torch's names and argument forms (re-exported by tardelli)."""
import builtins

import numpy as np

from . import _C
from ._tensor import Size, Tensor, TardelliError, as_device, as_dtype

_f32 = _C.dtype.float32
_i64 = _C.dtype.int64
_cpu = _C.device("cpu")


def _size_args(size):
    """zeros(2, 3), zeros((2, 3)), zeros([2, 3]) and zeros(Size) all give [2, 3]."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    return [int(s) for s in size]


def _opts(dtype, device, default=_f32):
    return (as_dtype(dtype) or default, as_device(device) or _cpu)


# ---- creation ----

_NP_FROM = {
    np.dtype(np.float32): _f32,
    np.dtype(np.float16): _C.dtype.float16,
    np.dtype(np.int32): _C.dtype.int32,
    np.dtype(np.int64): _i64,
    np.dtype(np.bool_): _C.dtype.bool,
}


def _default_dtype(arr):
    """torch.tensor's inference: Python/numpy floats -> float32 (float16 kept), integers -> int64,
    bools -> bool."""
    k = arr.dtype.kind
    if k == "b":
        return _C.dtype.bool
    if k in "iu":
        return _C.dtype.int32 if arr.dtype == np.int32 else _i64
    if k == "f":
        return _C.dtype.float16 if arr.dtype == np.float16 else _f32
    raise TypeError(f"tensor(): cannot make a tensor from data of numpy dtype {arr.dtype}")


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data` (nested lists, numbers, numpy arrays, tensors)."""
    dtype = as_dtype(dtype)
    if isinstance(data, Tensor):
        t = data.detach().clone()
    else:
        arr = np.asarray(data)
        if dtype is None:
            dtype = _default_dtype(arr)
        np_target = {v: k for k, v in _NP_FROM.items()}.get(dtype, np.dtype(np.float32))
        arr = np.asarray(arr, dtype=np_target, order="C")
        t = _C.from_numpy(arr).clone()
    if dtype is not None and t.dtype != dtype:
        t = t._to_dtype(dtype)
    if device is not None:
        t = t._to_device(as_device(device))
    if requires_grad:
        t.requires_grad_(True)
    return t


def as_tensor(data, dtype=None, device=None):
    if isinstance(data, Tensor):
        return data.to(dtype=dtype, device=device)
    if isinstance(data, np.ndarray) and (dtype is None or _NP_FROM.get(data.dtype) == dtype):
        try:
            return from_numpy(data)
        except TardelliError:
            pass
    return tensor(data, dtype=dtype, device=device)


def from_numpy(array):
    """A tensor sharing memory with `array` (which it keeps alive)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    return _C.from_numpy(array)


def empty(*size, dtype=None, device=None, requires_grad=False):
    return _C.empty(_size_args(size), *_opts(dtype, device), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    return _C.zeros(_size_args(size), *_opts(dtype, device), requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False):
    return _C.ones(_size_args(size), *_opts(dtype, device), requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        if isinstance(fill_value, (builtins.bool, np.bool_)):
            dtype = _C.dtype.bool
        elif isinstance(fill_value, (builtins.int, np.integer)):
            dtype = _i64
    if isinstance(size, (builtins.int, np.integer)):
        size = (size,)
    return _C.full(_size_args((size,)), builtins.float(fill_value), *_opts(dtype, device),
                   requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    if dtype is None:
        is_float = builtins.any(isinstance(v, (builtins.float, np.floating))
                                for v in (start, end, step))
        dtype = _f32 if is_float else _i64
    return _C.arange(builtins.float(start), builtins.float(end), builtins.float(step),
                     *_opts(dtype, device), requires_grad)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    return _C.rand(_size_args(size), *_opts(dtype, device), requires_grad, generator)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    return _C.randn(_size_args(size), *_opts(dtype, device), requires_grad, generator)


def randint(*args, size=None, generator=None, dtype=None, device=None, requires_grad=False):
    """randint(high, size) or randint(low, high, size): integers uniform in [low, high)."""
    if size is None:
        size, args = args[-1], args[:-1]
    low, high = (0, args[0]) if len(args) == 1 else args
    return _C.randint(int(low), int(high), _size_args((size,)), *_opts(dtype, device, _i64),
                      requires_grad, generator)


def _like(fn):
    def f(input, dtype=None, device=None, requires_grad=False, **kw):
        return fn(*input.shape, dtype=dtype or input.dtype, device=device or input.device,
                  requires_grad=requires_grad, **kw)
    f.__name__ = fn.__name__ + "_like"
    return f


empty_like = _like(empty)
zeros_like = _like(zeros)
ones_like = _like(ones)
rand_like = _like(rand)
randn_like = _like(randn)


def full_like(input, fill_value, dtype=None, device=None, requires_grad=False):
    return full(tuple(input.shape), fill_value, dtype=dtype or input.dtype,
                device=device or input.device, requires_grad=requires_grad)


# ---- ops whose Python forms differ from the C++ signature ----


def max(input, dim=None, keepdim=False):
    return input.max(dim, keepdim)


def min(input, dim=None, keepdim=False):
    return input.min(dim, keepdim)


def equal(input, other):
    """True when both tensors have the same shape and the same elements (torch.equal)."""
    return tuple(input.shape) == tuple(other.shape) and builtins.bool((input == other).all())


def _as_operand(x, like):
    if isinstance(x, Tensor):
        return x
    dtype = like.dtype if isinstance(like, Tensor) else _f32
    if isinstance(x, (builtins.float, np.floating)) and not dtype.is_floating_point:
        dtype = _f32
    return _C.scalar_tensor(builtins.float(x), dtype)


def where(condition, input, other):
    """condition ? input : other, broadcasting; input/other may be Python numbers."""
    a = _as_operand(input, other)
    b = _as_operand(other, a)
    return _C._where(condition, a, b)


def cat(tensors, dim=0):
    return _C.cat(list(tensors), dim)


concat = cat


def stack(tensors, dim=0):
    return _C.stack(list(tensors), dim)


def split(tensor, split_size_or_sections, dim=0):
    return tensor.split(split_size_or_sections, dim)


def chunk(input, chunks, dim=0):
    return input.chunk(chunks, dim)


def softmax(input, dim, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return _C.softmax(input, dim)


def log_softmax(input, dim, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return _C.log_softmax(input, dim)


def transpose(input, dim0, dim1):
    return input.transpose(dim0, dim1)


def permute(input, dims):
    return input.permute(*dims)


def reshape(input, shape):
    return input.reshape(*shape)


def flatten(input, start_dim=0, end_dim=-1):
    return input.flatten(start_dim, end_dim)


def squeeze(input, dim=None):
    return input.squeeze(dim)


def unsqueeze(input, dim):
    return input.unsqueeze(dim)


def narrow(input, dim, start, length):
    return input.narrow(dim, start, length)


def select(input, dim, index):
    return input.select(dim, index)


def t(input):
    return input.t()


def clone(input):
    return input.clone()


def detach(input):
    return input.detach()


def numel(input):
    return input.numel()


def is_tensor(obj):
    return isinstance(obj, Tensor)


def is_floating_point(input):
    return input.is_floating_point()


def get_default_dtype():
    return _f32


# ---- random state and memory ----


def manual_seed(seed):
    """Seeds the default generator; returns it."""
    return _C.manual_seed(int(seed))


def memory_stats(device="cpu"):
    """Allocator statistics: current_bytes (live tensors), peak_bytes, reserved_bytes (live
    plus blocks cached for reuse), num_allocs, num_frees."""
    return _C.memory_stats(as_device(device))


def reset_peak_memory_stats(device="cpu"):
    _C.reset_peak_memory_stats(as_device(device))


def empty_cache(device="cpu"):
    """Returns the allocator's cached free blocks to the system."""
    _C.empty_cache(as_device(device))


def to_fp8(input, dtype, saturate=True):
    """`input` converted to a float8 dtype (round to nearest even). With saturate, values beyond
    the format's range become +-max (448 for float8_e4m3fn, 57344 for float8_e5m2); without,
    the result is input.to(dtype)'s, which is torch's: NaN (e4m3fn) or +-inf (e5m2)."""
    return _C.to_fp8(input, as_dtype(dtype), saturate)


__all__ = [
    "Size", "tensor", "as_tensor", "from_numpy", "empty", "zeros", "ones", "full", "arange",
    "rand", "randn", "randint", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
    "randn_like", "max", "min", "where", "cat", "concat", "stack", "split", "chunk", "softmax",
    "log_softmax", "transpose", "permute", "reshape", "flatten", "squeeze", "unsqueeze",
    "narrow", "select", "t", "clone", "detach", "equal", "numel", "is_tensor", "is_floating_point",
    "get_default_dtype", "manual_seed", "memory_stats", "reset_peak_memory_stats", "empty_cache",
    "to_fp8",
]
