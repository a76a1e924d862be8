"""Python-side Tensor sugar: shape as a Size, indexing, operators, numpy interop, to().

The C++ class ``tardelli._C.Tensor`` carries the real methods (bound in python/src); this module
adds the parts that are Python protocol (``__getitem__``, ``__add__``, ``__array__``, ...) or that
parse torch's flexible argument forms, and installs them on that class once at import.
"""
import builtins
import collections
import operator

import numpy as np

from . import _C

Tensor = _C.Tensor
TardelliError = _C.TardelliError


class TardelliIndexError(TardelliError, IndexError):
    """An index out of range: both a TardelliError and a Python IndexError."""


class TardelliNotImplementedError(TardelliError, NotImplementedError):
    """A torch feature this library deliberately does not implement."""


class Size(tuple):
    """A tensor's shape: a tuple of ints (like torch.Size)."""

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self):
        return "tardelli.Size([" + ", ".join(str(s) for s in self) + "])"

    def __getitem__(self, key):
        r = tuple.__getitem__(self, key)
        return Size(r) if isinstance(key, slice) else r


max_result = collections.namedtuple("max", ["values", "indices"])
min_result = collections.namedtuple("min", ["values", "indices"])

_Number = (builtins.int, builtins.float, builtins.bool, np.number, np.bool_)


def _is_float_scalar(x):
    return isinstance(x, (builtins.float, np.floating))


def as_dtype(d):
    """Accepts a tardelli dtype or its name ('float32', 'bf16' is not accepted)."""
    if d is None or isinstance(d, _C.dtype):
        return d
    if isinstance(d, str):
        return getattr(_C.dtype, d)
    raise TypeError(f"expected a tardelli dtype, got {d!r}")


def as_device(d):
    if d is None or isinstance(d, _C.device):
        return d
    if isinstance(d, str):
        return _C.device(d)
    raise TypeError(f"expected a device or a string like 'cpu', got {d!r}")


# ---- shape and protocol ----


def _shape(self):
    return Size(self._shape)


def _size(self, dim=None):
    s = self._shape
    if dim is None:
        return Size(s)
    if not -len(s) <= dim < len(s):
        raise TardelliIndexError(
            f"size: dim {dim} out of range for a tensor with {len(s)} dims")
    return s[dim]


def _len(self):
    if self.dim() == 0:
        raise TypeError("len() of a 0-d tensor")
    return self._shape[0]


def _iter(self):
    if self.dim() == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self.select(0, i) for i in range(self._shape[0]))


def _T(self):
    if self.dim() < 2:
        return self
    return self.permute(*reversed(range(self.dim())))


def _bool(self):
    if self.numel() != 1:
        raise TardelliError(
            f"Boolean value of Tensor with {self.numel()} values is ambiguous")
    return builtins.bool(self.item())


def _index(self):
    if self.dtype not in (_C.dtype.int64, _C.dtype.int32) or self.numel() != 1:
        raise TypeError("only integer tensors of a single element can be converted to an index")
    return self.item()


def _format(self, spec):
    if self.dim() == 0:
        return format(self.item(), spec)
    return format(str(self), spec)


def _hash(self):
    return id(self)


# ---- numpy ----


def _numpy(self, force=False):
    t = self
    if force:
        t = t.detach()
        if t.dtype in (_C.dtype.bfloat16, _C.dtype.float8_e4m3fn, _C.dtype.float8_e5m2):
            t = t.float()
    elif t.requires_grad:
        raise TardelliError("numpy(): can't call numpy() on a tensor that requires grad; "
                            "use tensor.detach().numpy()")
    return t._numpy()


def _array(self, dtype=None, **kwargs):
    a = _numpy(self, force=True)
    return a if dtype is None else a.astype(dtype)


def _tolist(self):
    return _numpy(self, force=True).tolist()


# ---- conversions ----


def parse_to_args(args, dtype=None, device=None):
    """torch's to() positional forms: a dtype, a device (or its string), or a tensor whose
    dtype and device are taken. Returns (dtype, device), keyword values as defaults."""
    for a in args:
        if isinstance(a, _C.dtype):
            dtype = a
        elif isinstance(a, (str, _C.device)):
            device = a
        elif isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        else:
            raise TypeError(f"to(): unexpected argument {a!r}")
    return dtype, device


def _to(self, *args, dtype=None, device=None, non_blocking=False, copy=False):
    dtype, device = parse_to_args(args, dtype, device)
    t = self
    if device is not None:
        t = t._to_device(as_device(device))
    if dtype is not None:
        t = t._to_dtype(as_dtype(dtype))
    if t._impl_id() == self._impl_id():
        return t.clone() if copy else self
    return t


def _type_as(self, other):
    return _to(self, other.dtype)


def _new_factory(name):
    def f(self, *size, dtype=None, device=None, requires_grad=False):
        from . import _api
        return getattr(_api, name)(*size, dtype=dtype or self.dtype,
                                   device=device or self.device, requires_grad=requires_grad)
    f.__name__ = "new_" + name
    return f


def _new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
    from . import _api
    return _api.full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device,
                     requires_grad=requires_grad)


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    from . import _api
    return _api.tensor(data, dtype=dtype or self.dtype, device=device or self.device,
                       requires_grad=requires_grad)


# ---- reductions with torch's overloaded forms ----


def _max(self, dim=None, keepdim=False):
    if isinstance(dim, Tensor):
        return _C.maximum(self, dim)
    if dim is None:
        return _C._max_all(self)
    return max_result(*_C._max_dim(self, dim, keepdim))


def _min(self, dim=None, keepdim=False):
    if isinstance(dim, Tensor):
        return _C.minimum(self, dim)
    if dim is None:
        return _C._min_all(self)
    # The first minimum is the first maximum of the negation.
    values, indices = _C._max_dim(_C.neg(self), dim, keepdim)
    return min_result(_C.neg(values), indices)


# ---- operators ----


def _operand(self, other):
    """(self, other) ready for a C++ arithmetic op, or None if `other` is not supported.

    A Python float turns an integral tensor into float32 (torch's rule for wrapped numbers), and
    arithmetic on bool tensors happens in int64 (or float32 with a float scalar).
    """
    if isinstance(other, Tensor):
        if self.dtype == _C.dtype.bool and other.dtype != _C.dtype.bool:
            self = self.long()
        if other.dtype == _C.dtype.bool and self.dtype != _C.dtype.bool:
            other = other.long()
        return self, other
    if isinstance(other, np.ndarray):
        from . import _api
        return self, _api.tensor(other)
    if isinstance(other, _Number):
        if _is_float_scalar(other) and not self.is_floating_point():
            self = self.float()
        elif self.dtype == _C.dtype.bool:
            self = self.long()
        return self, builtins.float(other)
    return None


def _arith(fn, reflected=None):
    def op(self, other):
        ops = _operand(self, other)
        if ops is None:
            return NotImplemented
        a, b = ops
        if reflected is not None and not isinstance(b, Tensor):
            return reflected(a, b)
        if reflected is not None:
            return fn(b, a)
        return fn(a, b)
    return op


def _compare(fn):
    def op(self, other):
        if isinstance(other, Tensor):
            return fn(self, other)
        if isinstance(other, _Number):
            return fn(self, builtins.float(other))
        if isinstance(other, np.ndarray):
            from . import _api
            return fn(self, _api.tensor(other))
        return NotImplemented
    return op


def _matmul(self, other):
    if not isinstance(other, Tensor):
        return NotImplemented
    return _C.matmul(self, other)


def _rmatmul(self, other):
    if not isinstance(other, Tensor):
        return NotImplemented
    return _C.matmul(other, self)


def _check_inplace(self, op):
    if _C.is_grad_enabled() and self.requires_grad:
        raise TardelliError(f"{op}: in-place update of a tensor that requires grad "
                            f"({self.dtype}{list(self.shape)}) is not tracked by autograd; "
                            "wrap it in tardelli.no_grad()")


def _iadd(self, other):
    return self.add_(other)


def _isub(self, other):
    if isinstance(other, Tensor):
        return self.sub_(other)
    return self.add_(-builtins.float(other))


def _imul(self, other):
    if isinstance(other, Tensor):
        _check_inplace(self, "__imul__")
        return self.copy_(_C.mul(self, other))
    return self.mul_(builtins.float(other))


def _itruediv(self, other):
    _check_inplace(self, "__itruediv__")
    return self.copy_(_C.div(self, other))


# ---- indexing ----


def _to_index_tensor(k):
    from . import _api
    if isinstance(k, Tensor):
        return k
    arr = np.asarray(k)
    if arr.dtype == np.bool_:
        return _api.tensor(arr)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"tensors used as indices must be long, int or bool; got {arr.dtype}")
    return _api.tensor(arr.astype(np.int64))


def _is_int_key(k):
    return isinstance(k, (builtins.int, np.integer)) and not isinstance(k, (builtins.bool, np.bool_))


def _basic_index(self, key):
    """Applies ints, slices, None and Ellipsis; returns (view, advanced) where advanced is
    None or (dim, index tensor) for the one tensor/list index (applied by the caller)."""
    if not isinstance(key, tuple):
        key = (key,)
    key = tuple(_to_index_tensor(k) if isinstance(k, (list, np.ndarray)) else k for k in key)
    consumed = 0
    for k in key:
        if k is None or k is Ellipsis:
            continue
        consumed += k.dim() if isinstance(k, Tensor) and k.dtype == _C.dtype.bool else 1
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise TardelliIndexError("an index can only have a single ellipsis ('...')")
    if consumed > self.dim():
        raise TardelliIndexError(
            f"too many indices for tensor of dimension {self.dim()} ({consumed} given)")
    t, dim, advanced = self, 0, None
    for k in key:
        if k is None:
            t = t.unsqueeze(dim)
            dim += 1
        elif k is Ellipsis:
            dim += self.dim() - consumed
        elif _is_int_key(k):
            n = t.shape[dim]
            i = operator.index(k)
            if not -n <= i < n:
                raise TardelliIndexError(
                    f"index {i} is out of bounds for dimension {dim} with size {n}")
            t = t.select(dim, i)
        elif isinstance(k, slice):
            n = t.shape[dim]
            start, stop, step = k.indices(n)
            if step <= 0:
                raise ValueError("step must be greater than zero")
            t = t._slice(dim, start, builtins.max(stop, start), step)
            dim += 1
        elif isinstance(k, Tensor):
            if advanced is not None:
                raise TardelliNotImplementedError(
                    "indexing with more than one tensor/list index is not supported")
            advanced = (dim, k)
            dim += k.dim() if k.dtype == _C.dtype.bool else 1
        else:
            raise TypeError(f"unsupported index type {type(k).__name__}")
    return t, advanced


def _flat_positions(t, dim, index):
    """For an index tensor at `dim` of t: (t with the indexed dims flattened, int64 positions
    into that dim as a numpy array, the shape the positions take in the result)."""
    if index.dtype == _C.dtype.bool:
        k = index.dim()
        if tuple(index.shape) != tuple(t.shape[dim:dim + k]):
            raise TardelliIndexError(
                f"the shape of the mask {list(index.shape)} does not match the shape of the "
                f"indexed tensor {list(t.shape[dim:dim + k])} at dim {dim}")
        mask = index.numpy(force=True)
        pos = np.flatnonzero(mask.reshape(-1)).astype(np.int64)
        flat = t.flatten(dim, dim + k - 1) if k > 0 else t.unsqueeze(dim)
        return flat, pos, (pos.shape[0],)
    if index.dtype not in (_C.dtype.int64, _C.dtype.int32):
        raise TypeError(f"tensors used as indices must be long, int or bool; got {index.dtype}")
    n = t.shape[dim]
    pos = index.numpy(force=True).astype(np.int64)
    bad = (pos < -n) | (pos >= n)
    if bad.any():
        raise TardelliIndexError(
            f"index {int(pos[bad].reshape(-1)[0])} is out of bounds for dimension {dim} "
            f"with size {n}")
    pos = np.where(pos < 0, pos + n, pos)
    return t, pos.reshape(-1), tuple(index.shape)


def _getitem(self, key):
    from . import _api
    t, advanced = _basic_index(self, key)
    if advanced is None:
        return t
    dim, index = advanced
    flat, pos, shape = _flat_positions(t, dim, index)
    out = _C.index_select(flat, dim, _api.tensor(pos))
    if len(shape) != 1:
        out = out.reshape(*flat.shape[:dim], *shape, *flat.shape[dim + 1:])
    return out


def _setitem(self, key, value):
    from . import _api
    _check_inplace(self, "__setitem__")
    if isinstance(value, (list, tuple, np.ndarray)):
        value = _api.tensor(value, dtype=self.dtype)
    t, advanced = _basic_index(self, key)
    if advanced is None:
        if isinstance(value, Tensor):
            t.copy_(value)
        else:
            t.fill_(builtins.float(value))
        return
    dim, index = advanced
    flat, pos, shape = _flat_positions(t, dim, index)
    if isinstance(value, Tensor):
        value = value.expand(*flat.shape[:dim], *shape, *flat.shape[dim + 1:])
        value = value.reshape(*flat.shape[:dim], len(pos), *flat.shape[dim + 1:])
    for j, p in enumerate(pos.tolist()):
        dst = flat.select(dim, p)
        if isinstance(value, Tensor):
            dst.copy_(value.select(dim, j))
        else:
            dst.fill_(builtins.float(value))


def install():
    T = Tensor
    T.shape = property(_shape)
    T.size = _size
    T.__len__ = _len
    T.__iter__ = _iter
    T.T = property(_T)
    T.mT = property(lambda self: self.transpose(-2, -1))
    T.__bool__ = _bool
    T.__float__ = lambda self: builtins.float(self.item())
    T.__int__ = lambda self: builtins.int(self.item())
    T.__index__ = _index
    T.__format__ = _format
    T.__hash__ = _hash
    T.numpy = _numpy
    T.__array__ = _array
    T.__array_priority__ = 1000  # numpy scalars on the left defer to our reflected operators
    T.tolist = _tolist
    T.to = _to
    T.type_as = _type_as
    T.new_zeros = _new_factory("zeros")
    T.new_ones = _new_factory("ones")
    T.new_empty = _new_factory("empty")
    T.new_full = _new_full
    T.new_tensor = _new_tensor
    T.max = _max
    T.min = _min
    T.__getitem__ = _getitem
    T.__setitem__ = _setitem
    T.__add__ = _arith(_C.add)
    T.__radd__ = _arith(_C.add)
    T.__sub__ = _arith(_C.sub)
    T.__rsub__ = _arith(_C.sub, reflected=_C.rsub)
    T.__mul__ = _arith(_C.mul)
    T.__rmul__ = _arith(_C.mul)
    T.__truediv__ = _arith(_C.div)
    T.__rtruediv__ = _arith(_C.div, reflected=_C.rdiv)
    T.__pow__ = _arith(_C.pow)
    T.__rpow__ = _arith(_C.pow, reflected=_C.rpow)
    T.__matmul__ = _matmul
    T.__rmatmul__ = _rmatmul
    T.__neg__ = lambda self: _C.neg(self)
    T.__pos__ = lambda self: self
    T.__abs__ = lambda self: _C.abs(self)
    T.__invert__ = lambda self: _C.logical_not(self)
    T.__eq__ = _compare(_C.eq)
    T.__ne__ = _compare(_C.ne)
    T.__lt__ = _compare(_C.lt)
    T.__le__ = _compare(_C.le)
    T.__gt__ = _compare(_C.gt)
    T.__ge__ = _compare(_C.ge)
    T.__iadd__ = _iadd
    T.__isub__ = _isub
    T.__imul__ = _imul
    T.__itruediv__ = _itruediv
