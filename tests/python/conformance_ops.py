"""The op-conformance table (ggml-style: adding an op means adding a row).

Each row (`Op`) names one op and gives
  * `fn(lib, *inputs, **kw)`: the call, written once for `lib` = tardelli or torch (same names);
    `torch_fn` overrides it for torch where torch's spelling or semantics differ;
  * `ref(*inputs, **kw)`: a float64 numpy reference, the ground truth;
  * `cases`: input generators (shape, value range, which inputs are differentiable) and kwargs.
The harness (test_conformance.py) runs every case for every dtype in `dtypes` and every memory
layout that applies (contiguous, transposed view, strided slice, expanded broadcast), checking the
forward and the gradients of sum(out * W) against the reference and against PyTorch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

# ---------------------------------------------------------------------------------------------
# Input generators


@dataclass(frozen=True)
class F:
    """A floating input of the op's dtype (or `fixed_dtype`).

    kind: "uniform" in [lo, hi]; "awayzero": |x| in [lo, hi], random sign (kinks at 0: relu,
    abs, division); "distinct": well-separated values even after bf16 rounding (max / argmax
    have no ties, so the gradient is unique); "grid": small integers (comparisons hit equality).
    `layouts` limits which non-contiguous layouts may transform this input.
    """

    shape: tuple
    lo: float = -2.0
    hi: float = 2.0
    grad: bool = True
    kind: str = "uniform"
    fixed_dtype: Optional[str] = None
    layouts: tuple = ("T", "S", "E")
    gen: Optional[Callable] = None  # gen(rng, shape) -> float64 array, overrides kind


@dataclass(frozen=True)
class I:
    """An integer input (indices, targets); never differentiable, always contiguous."""

    shape: tuple
    lo: int = 0
    hi: int = 4  # exclusive
    dtype: str = "int64"
    gen: Optional[Callable] = None  # gen(rng) -> int array


@dataclass(frozen=True)
class M:
    """A bool input (masks, conditions)."""

    shape: tuple
    p: float = 0.5  # probability of True
    gen: Optional[Callable] = None  # gen(rng) -> bool array


@dataclass
class Case:
    id: str
    inputs: list
    kw: dict = field(default_factory=dict)


@dataclass
class Op:
    name: str
    fn: Callable
    ref: Callable
    cases: list
    torch_fn: Optional[Callable] = None
    dtypes: tuple = ("float32", "bfloat16")
    backward: bool = True  # False for ops without float outputs / not differentiable
    layouts: bool = True  # False: contiguous inputs only
    # Per-dtype tolerance overrides {dtype: (fwd, bwd)}; each carries a justification comment.
    tol: dict = field(default_factory=dict)


def gen_values(rng: np.random.Generator, spec: F, shape: tuple) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    if spec.gen is not None:
        return np.asarray(spec.gen(rng, shape), dtype=np.float64).reshape(shape)
    if spec.kind == "uniform":
        return rng.uniform(spec.lo, spec.hi, size=shape)
    if spec.kind == "awayzero":
        return rng.uniform(spec.lo, spec.hi, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    if spec.kind == "distinct":
        # Separation >= 0.6 (hi-lo)/n: survives bf16 rounding (half-ulp <= 2^-8 * |x|) for n <= 100
        # in [-2, 2].
        perm = rng.permutation(n) + 0.5 + rng.uniform(-0.2, 0.2, size=n)
        return (spec.lo + perm / max(n, 1) * (spec.hi - spec.lo)).reshape(shape)
    if spec.kind == "grid":
        return rng.integers(-2, 3, size=shape).astype(np.float64)
    raise ValueError(spec.kind)


# ---------------------------------------------------------------------------------------------
# float64 numpy references

_erf = np.vectorize(math.erf, otypes=[np.float64])


def np_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_softmax(x, dim):
    m = np.max(x, axis=dim, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=dim, keepdims=True)


def np_log_softmax(x, dim):
    m = np.max(x, axis=dim, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=dim, keepdims=True))


def _axes(ndim, dim):
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(d % ndim for d in dim) if ndim else ()


def np_var(x, dim=None, correction=1, keepdim=False):
    ax = _axes(x.ndim, dim)
    n = int(np.prod([x.shape[a] for a in ax])) if ax else 1
    m = np.mean(x, axis=ax, keepdims=True)
    return np.sum((x - m) ** 2, axis=ax, keepdims=keepdim) / (n - correction)


def np_layer_norm(x, ns, w=None, b=None, eps=1e-5):
    ax = tuple(range(x.ndim - len(ns), x.ndim))
    mu = x.mean(axis=ax, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=ax, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def np_rms_norm(x, ns, w=None, eps=1e-6):
    ax = tuple(range(x.ndim - len(ns), x.ndim))
    y = x / np.sqrt((x * x).mean(axis=ax, keepdims=True) + eps)
    return y * w if w is not None else y


def np_cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """torch's layout: logits [N, C] or [N, C, d1, ...], target [N] or [N, d1, ...]."""
    if logits.ndim > 2:
        logits = np.moveaxis(logits, 1, -1)
    lp = np_log_softmax(logits, -1)
    keep = target != ignore_index
    t = np.where(keep, target, 0).astype(np.int64)
    nll = -np.take_along_axis(lp, t[..., None], axis=-1)[..., 0]
    smooth = -lp.mean(axis=-1)
    loss = np.where(keep, (1.0 - label_smoothing) * nll + label_smoothing * smooth, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / keep.sum()


def np_sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    d = q.shape[-1]
    s = scale if scale is not None else 1.0 / math.sqrt(d)
    rep = q.shape[-3] // k.shape[-3]  # GQA: query head h reads kv head h // rep
    k = np.repeat(k, rep, axis=-3)
    v = np.repeat(v, rep, axis=-3)
    sc = (q @ np.swapaxes(k, -1, -2)) * s
    if mask is not None:
        sc = np.where(mask, sc, -np.inf) if mask.dtype == np.bool_ else sc + mask
    if is_causal:
        tq, tk = sc.shape[-2], sc.shape[-1]
        allowed = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)
        sc = np.where(allowed, sc, -np.inf)
    return np_softmax(sc, -1) @ v


def rope_tables(t, d, base=10000.0, start=0):
    inv = base ** (-np.arange(0, d // 2, dtype=np.float64) * 2.0 / d)
    ang = np.arange(start, start + t, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


def np_rotary(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def np_index_add(x, dim, index, src):
    out = np.array(x, dtype=np.float64, copy=True)
    xm = np.moveaxis(out, dim, 0)
    sm = np.moveaxis(src, dim, 0)
    for j, i in enumerate(index):
        xm[i] += sm[j]
    return out


def np_split(x, split, dim=0):
    if isinstance(split, int):
        idx = list(range(split, x.shape[dim], split))
    else:
        idx = list(np.cumsum(split)[:-1])
    return np.split(x, idx, axis=dim)


def np_sum_to(x, shape):
    """Sums x down to the broadcast-compatible `shape` (leading dims dropped, size-1 dims kept)."""
    y = x.sum(axis=tuple(range(x.ndim - len(shape))))
    return y.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


def np_max_dim(x, dim, keepdim=False):
    i = np.argmax(x, axis=dim)
    v = np.take_along_axis(x, np.expand_dims(i, dim), axis=dim)
    if not keepdim:
        v = np.squeeze(v, dim)
    else:
        i = np.expand_dims(i, dim)
    return [v, i]


# torch-side spellings for ops torch 1.13 lacks or places elsewhere (computed in float64).


def t_rms_norm(torch, x, ns, w=None, eps=1e-6):
    dims = tuple(range(x.dim() - len(ns), x.dim()))
    y = x * torch.rsqrt((x * x).mean(dim=dims, keepdim=True) + eps)
    return y * w if w is not None else y


def t_sdpa(torch, q, k, v, attn_mask=None, is_causal=False, scale=None):
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    rep = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(rep, dim=-3)
    v = v.repeat_interleave(rep, dim=-3)
    sc = (q @ k.transpose(-1, -2)) * s
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            sc = sc.masked_fill(~attn_mask, float("-inf"))
        else:
            sc = sc + attn_mask
    if is_causal:
        tq, tk = sc.shape[-2], sc.shape[-1]
        allowed = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
        sc = sc.masked_fill(~allowed, float("-inf"))
    return torch.softmax(sc, -1) @ v


def t_rotary(torch, x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def t_cross_entropy(torch, logits, target, **kw):
    return torch.nn.functional.cross_entropy(logits, target.long(), **kw)  # torch wants int64


def _F(lib):
    return lib.nn.functional


# ---------------------------------------------------------------------------------------------
# The table

X34 = (3, 4)
X234 = (2, 3, 4)

UNARY_SHAPES = [("2d", (3, 5)), ("3d", (2, 3, 4)), ("1elem", (1,)), ("scalar0d", ()),
                ("empty", (0, 3))]


def unary(name, fn, ref, lo=-2.0, hi=2.0, kind="uniform", tol=None, shapes=UNARY_SHAPES):
    cases = [Case(sid, [F(s, lo, hi, kind=kind)]) for sid, s in shapes]
    return Op(name, fn, ref, cases, tol=tol or {})


BIN_SHAPES = [
    ("same", (3, 4), (3, 4)),
    ("bcast_row", (2, 3, 4), (4,)),
    ("bcast_outer", (3, 1), (1, 4)),
    ("bcast_3d", (2, 1, 4), (3, 1)),
    ("tensor0d", (3, 4), ()),
    ("empty", (0, 4), (4,)),
]


def binary(name, fn, ref, a=dict(), b=dict(), shapes=BIN_SHAPES):
    cases = [Case(sid, [F(sa, **a), F(sb, **b)]) for sid, sa, sb in shapes]
    return Op(name, fn, ref, cases)


SCALAR = [("s", (3, 4)), ("s3d", (2, 3, 4))]


def scalar_op(name, fn, ref, **spec):
    return Op(name, fn, ref, [Case(sid, [F(s, **spec)]) for sid, s in SCALAR])


def _float_mask(rng, shape):
    """Additive mask with some -inf entries; column 0 stays finite so no row is fully masked."""
    m = rng.uniform(-1.0, 1.0, shape)
    m[rng.random(shape) < 0.25] = -np.inf
    m[..., 0] = rng.uniform(-1.0, 1.0, shape[:-1])
    return m


OPS: list = [
    # ---- elementwise binary with broadcasting (tensor-tensor) ----
    binary("add", lambda lib, a, b: a + b, lambda a, b: a + b),
    binary("add_alpha", lambda lib, a, b: lib.add(a, b, alpha=0.5), lambda a, b: a + 0.5 * b),
    binary("sub", lambda lib, a, b: a - b, lambda a, b: a - b),
    binary("sub_alpha", lambda lib, a, b: lib.sub(a, b, alpha=2.0), lambda a, b: a - 2.0 * b),
    binary("mul", lambda lib, a, b: a * b, lambda a, b: a * b),
    # |b| in [1, 2]: the gradient -g a / b^2 stays O(1), so in bf16 the per-element rounding
    # (2^-9 relative) summed over a broadcast dim stays within the bf16 tolerance.
    binary("div", lambda lib, a, b: a / b, lambda a, b: a / b,
           b=dict(lo=1.0, hi=2.0, kind="awayzero")),
    binary("pow", lambda lib, a, b: lib.pow(a, b), lambda a, b: a**b, a=dict(lo=0.5, hi=2.0)),
    binary("maximum", lambda lib, a, b: lib.maximum(a, b), np.maximum, a=dict(kind="distinct"),
           b=dict(kind="distinct", lo=-1.9, hi=1.9)),
    binary("minimum", lambda lib, a, b: lib.minimum(a, b), np.minimum, a=dict(kind="distinct"),
           b=dict(kind="distinct", lo=-1.9, hi=1.9)),
    # ---- scalar forms (including reflected: b - a, b / a, b ** a) ----
    scalar_op("add_scalar", lambda lib, a: a + 2.5, lambda a: a + 2.5),
    scalar_op("radd_scalar", lambda lib, a: 2.5 + a, lambda a: 2.5 + a),
    scalar_op("sub_scalar", lambda lib, a: a - 1.25, lambda a: a - 1.25),
    scalar_op("rsub_scalar", lambda lib, a: 1.25 - a, lambda a: 1.25 - a),
    scalar_op("mul_scalar", lambda lib, a: a * -1.5, lambda a: a * -1.5),
    scalar_op("rmul_scalar", lambda lib, a: -1.5 * a, lambda a: -1.5 * a),
    scalar_op("div_scalar", lambda lib, a: a / 3.0, lambda a: a / 3.0),
    scalar_op("rdiv_scalar", lambda lib, a: 3.0 / a, lambda a: 3.0 / a, lo=0.5, hi=2.0,
              kind="awayzero"),
    scalar_op("pow_scalar2", lambda lib, a: a**2, lambda a: a**2),
    scalar_op("pow_scalar_half", lambda lib, a: a**0.5, lambda a: a**0.5, lo=0.3, hi=3.0),
    scalar_op("pow_scalar_neg", lambda lib, a: lib.pow(a, -1.5), lambda a: a**-1.5, lo=0.5, hi=2.0),
    scalar_op("rpow_scalar", lambda lib, a: 2.0**a, lambda a: 2.0**a),
    scalar_op("neg", lambda lib, a: -a, lambda a: -a),
    Op("clamp", lambda lib, a, **kw: lib.clamp(a, **kw),
       lambda a, min=None, max=None: np.clip(a, min, max),
       [Case("both", [F((3, 5))], dict(min=-0.4321, max=0.6789)),
        Case("min_only", [F((2, 3, 4))], dict(min=-0.4321)),
        Case("max_only", [F((2, 3, 4))], dict(max=0.6789))]),
    # ---- elementwise unary ----
    unary("exp", lambda lib, a: lib.exp(a), np.exp, -3.0, 3.0),
    unary("log", lambda lib, a: lib.log(a), np.log, 0.2, 4.0),
    unary("tanh", lambda lib, a: lib.tanh(a), np.tanh, -3.0, 3.0),
    unary("sqrt", lambda lib, a: lib.sqrt(a), np.sqrt, 0.2, 4.0),
    unary("rsqrt", lambda lib, a: lib.rsqrt(a), lambda a: 1.0 / np.sqrt(a), 0.2, 4.0),
    unary("sigmoid", lambda lib, a: lib.sigmoid(a), np_sigmoid, -4.0, 4.0),
    unary("abs", lambda lib, a: lib.abs(a), np.abs, 0.1, 2.0, kind="awayzero"),
    unary("sin", lambda lib, a: lib.sin(a), np.sin, -3.0, 3.0),
    unary("cos", lambda lib, a: lib.cos(a), np.cos, -3.0, 3.0),
    unary("gelu", lambda lib, a: _F(lib).gelu(a), np_gelu, -4.0, 4.0),
    unary("gelu_tanh", lambda lib, a: _F(lib).gelu(a, approximate="tanh"),
          lambda a: np_gelu(a, "tanh"), -4.0, 4.0),
    unary("silu", lambda lib, a: _F(lib).silu(a), lambda a: a * np_sigmoid(a), -4.0, 4.0),
    unary("relu", lambda lib, a: _F(lib).relu(a), lambda a: np.maximum(a, 0.0), 0.1, 2.0,
          kind="awayzero"),
    # ---- comparisons and logical_not (bool outputs, exact) ----
    *[Op(f"cmp_{n}", (lambda n: lambda lib, a, b: getattr(lib, n)(a, b))(n), f,
         [Case("same", [F(X34, kind="grid", grad=False), F(X34, kind="grid", grad=False)]),
          Case("bcast", [F(X234, kind="grid", grad=False), F((3, 1), kind="grid", grad=False)])],
         backward=False)
      for n, f in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)]],
    *[Op(f"cmp_{n}_scalar", (lambda n: lambda lib, a: getattr(lib, n)(a, 1.0))(n),
         (lambda f: lambda a: f(a, 1.0))(f),
         [Case("s", [F(X234, kind="grid", grad=False)])], backward=False)
      for n, f in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)]],
    Op("logical_not", lambda lib, m: lib.logical_not(m), np.logical_not,
       [Case("2d", [M(X34)]), Case("3d", [M(X234)])], dtypes=("float32",), backward=False),
    # ---- reductions ----
    Op("sum", lambda lib, x, **kw: lib.sum(x, **kw),
       lambda x, dim=None, keepdim=False: np.sum(x, axis=_axes(x.ndim, dim), keepdims=keepdim),
       [Case("all", [F((4, 5))]), Case("dim0", [F(X234)], dict(dim=0)),
        Case("dim_last_keep", [F(X234)], dict(dim=-1, keepdim=True)),
        Case("dims02", [F(X234)], dict(dim=(0, 2))),
        Case("long_row", [F((2, 100))], dict(dim=1)),
        Case("empty", [F((0, 3))], dict(dim=0)), Case("scalar0d", [F(())])]),
    Op("mean", lambda lib, x, **kw: lib.mean(x, **kw),
       lambda x, dim=None, keepdim=False: np.mean(x, axis=_axes(x.ndim, dim), keepdims=keepdim),
       [Case("all", [F((4, 5))]), Case("dim1", [F(X234)], dict(dim=1)),
        Case("dims12_keep", [F(X234)], dict(dim=(1, 2), keepdim=True))]),
    Op("max_all", lambda lib, x: lib.max(x), np.max,
       [Case("2d", [F((4, 5), kind="distinct", layouts=("T", "S"))]),
        Case("1elem", [F((1,))])]),
    Op("min_all", lambda lib, x: lib.min(x), np.min,
       [Case("2d", [F((4, 5), kind="distinct", layouts=("T", "S"))])]),
    Op("max_dim", lambda lib, x, **kw: lib.max(x, **kw), np_max_dim,
       [Case("dim1", [F(X234, kind="distinct", layouts=("T", "S"))], dict(dim=1)),
        Case("dim_last_keep", [F(X234, kind="distinct", layouts=("T", "S"))],
             dict(dim=-1, keepdim=True))]),
    Op("argmax", lambda lib, x, **kw: lib.argmax(x, **kw),
       lambda x, dim=None, keepdim=False: (np.argmax(x) if dim is None else
                                           (np.expand_dims(np.argmax(x, axis=dim), dim) if keepdim
                                            else np.argmax(x, axis=dim))),
       [Case("all", [F((4, 5), kind="distinct", grad=False, layouts=("T", "S"))]),
        Case("dim0", [F(X234, kind="distinct", grad=False, layouts=("T", "S"))], dict(dim=0)),
        Case("dim2_keep", [F(X234, kind="distinct", grad=False, layouts=("T", "S"))],
             dict(dim=2, keepdim=True))], backward=False),
    Op("amax", lambda lib, x, **kw: lib.amax(x, **kw),
       lambda x, dim, keepdim=False: np.max(x, axis=_axes(x.ndim, dim), keepdims=keepdim),
       [Case("dim1", [F(X234, kind="distinct", layouts=("T", "S"))], dict(dim=1)),
        Case("dims02_keep", [F(X234, kind="distinct", layouts=("T", "S"))],
             dict(dim=(0, 2), keepdim=True))]),
    Op("var", lambda lib, x, **kw: lib.var(x, **kw), np_var,
       [Case("all", [F((4, 5))]), Case("dim1", [F(X234)], dict(dim=1)),
        Case("dim_last_pop_keep", [F(X234)], dict(dim=-1, correction=0, keepdim=True)),
        Case("dims01", [F(X234)], dict(dim=(0, 1)))]),
    Op("norm", lambda lib, x: lib.norm(x), lambda x: np.sqrt(np.sum(x * x)),
       [Case("2d", [F((4, 5))]), Case("3d", [F(X234)])]),
    # ---- matrix products ----
    Op("matmul", lambda lib, a, b: lib.matmul(a, b), np.matmul,
       [Case("2d", [F((4, 5)), F((5, 3))]),
        Case("batched", [F((2, 4, 5)), F((2, 5, 3))]),
        Case("bcast_batch_rhs2d", [F((2, 4, 5)), F((5, 3))]),
        Case("bcast_batch_4d", [F((2, 1, 3, 4)), F((3, 4, 2))]),
        Case("vec_mat", [F((5,)), F((5, 3))]),
        Case("mat_vec", [F((4, 5)), F((5,))]),
        Case("dot", [F((6,)), F((6,))]),
        Case("k0", [F((3, 0)), F((0, 2))]),
        Case("long_k", [F((2, 96)), F((96, 2))])]),
    Op("mm", lambda lib, a, b: lib.mm(a, b), np.matmul,
       [Case("2d", [F((4, 5)), F((5, 3))]), Case("1x1", [F((1, 1)), F((1, 1))])]),
    Op("bmm", lambda lib, a, b: lib.bmm(a, b), np.matmul,
       [Case("3d", [F((2, 4, 5)), F((2, 5, 3))]), Case("b1", [F((1, 3, 4)), F((1, 4, 2))])]),
    Op("linear", lambda lib, *xs: _F(lib).linear(*xs),
       lambda x, w, b=None: x @ w.T + (0.0 if b is None else b),
       [Case("bias", [F((3, 5)), F((4, 5)), F((4,))]),
        Case("bias_3d", [F((2, 3, 5)), F((4, 5)), F((4,))]),
        Case("nobias", [F((2, 3, 5)), F((4, 5))])]),
    # ---- softmax ----
    *[Op(name, (lambda f: lambda lib, x, dim: getattr(_F(lib), f)(x, dim))(name), ref,
         [Case("last", [F(X234, -3, 3)], dict(dim=-1)),
          # Not "E": an input expanded along the softmax dim makes the output constant (zero
          # gradient), a degenerate case for a relative error.
          Case("dim0", [F(X234, -3, 3, layouts=("T", "S"))], dict(dim=0)),
          Case("dim1", [F(X234, -3, 3)], dict(dim=1)),
          Case("long_row", [F((2, 96), -3, 3)], dict(dim=1)),
          # exp(x) overflows fp32 here (x > 88.7): only a max-shifted softmax survives. The range
          # stays within a factor 2 so x - max(x) is exact (Sterbenz) and precision is unaffected.
          Case("large_logits", [F((3, 6), 90.0, 120.0)], dict(dim=-1)),
          Case("1elem", [F((1, 1))], dict(dim=-1))])
      for name, ref in [("softmax", np_softmax), ("log_softmax", np_log_softmax)]],
    Op("softmax_toplevel", lambda lib, x: lib.softmax(x, -1), lambda x: np_softmax(x, -1),
       [Case("2d", [F(X34, -3, 3)])]),
    Op("log_softmax_toplevel", lambda lib, x: lib.log_softmax(x, 1), lambda x: np_log_softmax(x, 1),
       [Case("3d", [F(X234, -3, 3)])]),
    # ---- normalization ----
    Op("layer_norm", lambda lib, x, *wb, ns, eps=1e-5: _F(lib).layer_norm(x, ns, *wb, eps=eps),
       lambda x, *wb, ns, eps=1e-5: np_layer_norm(x, ns, *wb, eps=eps),
       [Case("affine", [F((3, 8)), F((8,)), F((8,))], dict(ns=(8,))),
        Case("affine_3d", [F((2, 3, 6)), F((6,)), F((6,))], dict(ns=(6,))),
        Case("noaffine", [F((3, 8))], dict(ns=(8,))),
        Case("two_dims", [F((2, 3, 4)), F((3, 4)), F((3, 4))], dict(ns=(3, 4))),
        Case("eps", [F((4, 5), -0.01, 0.01), F((5,)), F((5,))], dict(ns=(5,), eps=1e-3))]),
    Op("rms_norm", lambda lib, x, *w, ns, eps=1e-6: _F(lib).rms_norm(x, ns, *w, eps=eps),
       lambda x, *w, ns, eps=1e-6: np_rms_norm(x, ns, *w, eps=eps),
       [Case("weight", [F((3, 8)), F((8,))], dict(ns=(8,))),
        Case("weight_3d", [F((2, 3, 6)), F((6,))], dict(ns=(6,))),
        Case("noweight", [F((3, 8))], dict(ns=(8,))),
        Case("two_dims", [F((2, 3, 4)), F((3, 4))], dict(ns=(3, 4)))],
       torch_fn=lambda torch, x, *w, ns, eps=1e-6: t_rms_norm(torch, x, ns, *w, eps=eps)),
    # ---- embedding, loss ----
    Op("embedding", lambda lib, idx, w: _F(lib).embedding(idx, w), lambda idx, w: w[idx],
       [Case("2d_idx", [I((2, 5), 0, 7), F((7, 4))]),
        Case("1d_idx_repeats", [I((6,), gen=lambda r: np.array([1, 3, 1, 1, 0, 3])), F((5, 3))]),
        Case("int32_idx", [I((2, 3), 0, 6, dtype="int32"), F((6, 4))])]),
    Op("cross_entropy", lambda lib, x, t, **kw: _F(lib).cross_entropy(x, t, **kw), np_cross_entropy,
       [Case("mean", [F((6, 5), -3, 3), I((6,), 0, 5)]),
        Case("sum", [F((6, 5), -3, 3), I((6,), 0, 5)], dict(reduction="sum")),
        Case("none", [F((6, 5), -3, 3), I((6,), 0, 5)], dict(reduction="none")),
        Case("ignore", [F((6, 5), -3, 3),
                        I((6,), gen=lambda r: np.array([1, -100, 4, 0, -100, 2]))]),
        Case("ignore_custom_sum",
             [F((5, 4), -3, 3), I((5,), gen=lambda r: np.array([3, 1, 3, 0, 2]))],
             dict(ignore_index=3, reduction="sum")),
        Case("smooth", [F((6, 5), -3, 3), I((6,), 0, 5)], dict(label_smoothing=0.1)),
        Case("smooth_ignore_none",
             [F((6, 5), -3, 3), I((6,), gen=lambda r: np.array([1, -100, 4, 0, -100, 2]))],
             dict(label_smoothing=0.2, reduction="none")),
        Case("3d_logits_class_dim1", [F((2, 5, 3), -3, 3), I((2, 3), 0, 5)]),
        Case("4d_logits_ignore_none", [F((2, 4, 3, 2), -3, 3), I((2, 3, 2), -1, 4)],
             dict(ignore_index=-1, reduction="none", label_smoothing=0.05)),
        Case("int32_target", [F((4, 5), -3, 3), I((4,), 0, 5, dtype="int32")]),
        Case("wide_vocab", [F((2, 90), -3, 3), I((2,), 0, 90)])],
       torch_fn=lambda torch, x, t, **kw: t_cross_entropy(torch, x, t, **kw)),
    # ---- dropout (deterministic properties; statistics are tested separately) ----
    Op("dropout", lambda lib, x, **kw: _F(lib).dropout(x, **kw), lambda x, **kw: x,
       [Case("p0_train", [F(X234)], dict(p=0.0, training=True)),
        Case("eval", [F(X234)], dict(p=0.5, training=False))]),
    # ---- indexing ----
    Op("masked_fill", lambda lib, x, m: lib.masked_fill(x, m, -0.75),
       lambda x, m: np.where(m, -0.75, x),
       [Case("same", [F(X34), M(X34)]), Case("bcast_row", [F(X234), M((4,))]),
        Case("bcast_col", [F(X234), M((3, 1))])]),
    Op("masked_fill_method", lambda lib, x, m: x.masked_fill(m, 2.0),
       lambda x, m: np.where(m, 2.0, x),
       [Case("same", [F(X34), M(X34)])]),
    Op("where", lambda lib, c, a, b: lib.where(c, a, b), np.where,
       [Case("same", [M(X34), F(X34), F(X34)]),
        Case("bcast_all", [M((3, 1)), F((2, 3, 4)), F((4,))]),
        Case("bcast_cond", [M((4,)), F(X34), F((3, 1))])]),
    *[Op(name, (lambda name: lambda lib, x, k: getattr(lib, name)(x, k))(name),
         (lambda f: lambda x, k: f(x, k))(f),
         [Case("k0", [F((4, 5))], dict(k=0)), Case("k1", [F((4, 5))], dict(k=1)),
          Case("km1_batched", [F((2, 4, 3))], dict(k=-1)), Case("wide_k", [F((3, 3))], dict(k=5))])
      for name, f in [("tril", np.tril), ("triu", np.triu)]],
    Op("index_select", lambda lib, x, i, dim: lib.index_select(x, dim, i),
       lambda x, i, dim: np.take(x, i, axis=dim),
       [Case("dim0_repeats", [F((5, 3)), I((4,), gen=lambda r: np.array([4, 0, 4, 2]))],
             dict(dim=0)),
        Case("dim1", [F(X234), I((3,), gen=lambda r: np.array([3, 1, 1]))], dict(dim=2)),
        Case("int32", [F((4, 3)), I((2,), gen=lambda r: np.array([2, 0]), dtype="int32")],
             dict(dim=0))]),
    Op("index_add", lambda lib, x, i, s, dim: lib.index_add(x, dim, i, s),
       lambda x, i, s, dim: np_index_add(x, dim, i, s),
       [Case("dim0_repeats", [F((5, 3)), I((4,), gen=lambda r: np.array([4, 0, 4, 2])), F((4, 3))],
             dict(dim=0)),
        Case("dim1", [F((2, 4)), I((3,), gen=lambda r: np.array([3, 1, 1])), F((2, 3))],
             dict(dim=1))]),
    # ---- join / split ----
    Op("cat", lambda lib, *xs, dim: lib.cat(list(xs), dim=dim),
       lambda *xs, dim: np.concatenate(xs, axis=dim),
       [Case("dim0", [F((2, 3)), F((1, 3)), F((3, 3))], dict(dim=0)),
        Case("dim1_3d", [F((2, 1, 4)), F((2, 3, 4))], dict(dim=1)),
        Case("dim_last", [F((2, 3)), F((2, 2))], dict(dim=-1)),
        Case("with_empty", [F((2, 3)), F((0, 3)), F((1, 3))], dict(dim=0))]),
    Op("stack", lambda lib, *xs, dim: lib.stack(list(xs), dim=dim),
       lambda *xs, dim: np.stack(xs, axis=dim),
       [Case("dim0", [F(X34), F(X34)], dict(dim=0)),
        Case("dim1", [F(X34), F(X34), F(X34)], dict(dim=1)),
        Case("dim_last", [F(X34), F(X34)], dict(dim=2))]),
    Op("split", lambda lib, x, s, dim: list(lib.split(x, s, dim=dim)),
       lambda x, s, dim: np_split(x, s, dim),
       [Case("even", [F((6, 3))], dict(s=2, dim=0)), Case("ragged", [F((2, 7))], dict(s=3, dim=1)),
        Case("sizes", [F((2, 6, 2))], dict(s=[1, 3, 2], dim=1))]),
    Op("split_method", lambda lib, x: list(x.split(2, 1)), lambda x: np_split(x, 2, 1),
       [Case("2d", [F((3, 5))])]),
    Op("chunk", lambda lib, x, n, dim: list(lib.chunk(x, n, dim=dim)),
       lambda x, n, dim: np_split(x, -(-x.shape[dim] // n), dim),
       [Case("even", [F((6, 3))], dict(n=3, dim=0)),
        Case("ragged", [F((2, 7))], dict(n=3, dim=1))]),
    # ---- views (differentiable) and copies ----
    Op("reshape", lambda lib, x: x.reshape(4, 6), lambda x: x.reshape(4, 6),
       [Case("3d", [F(X234)])]),
    Op("view", lambda lib, x: x.view(4, 6), lambda x: x.reshape(4, 6), [Case("3d", [F(X234)])],
       layouts=False),  # view needs compatible strides; reshape covers the other layouts
    Op("view_flatten", lambda lib, x: x.flatten(), lambda x: x.reshape(-1),
       [Case("3d", [F(X234)])]),
    Op("permute", lambda lib, x: x.permute(2, 0, 1), lambda x: np.transpose(x, (2, 0, 1)),
       [Case("3d", [F(X234)])]),
    Op("transpose", lambda lib, x: x.transpose(0, 2), lambda x: np.swapaxes(x, 0, 2),
       [Case("3d", [F(X234)])]),
    Op("T", lambda lib, x: x.T, lambda x: x.T, [Case("2d", [F(X34)])]),
    Op("narrow", lambda lib, x: x.narrow(1, 1, 2), lambda x: x[:, 1:3], [Case("3d", [F(X234)])]),
    Op("select", lambda lib, x: x.select(1, 2), lambda x: x[:, 2], [Case("3d", [F(X234)])]),
    Op("getitem", lambda lib, x: x[1:, ::2], lambda x: x[1:, ::2], [Case("3d", [F((3, 5, 2))])]),
    Op("getitem_int", lambda lib, x: x[1], lambda x: x[1], [Case("3d", [F(X234)])]),
    Op("unsqueeze_squeeze", lambda lib, x: x.unsqueeze(1).squeeze(1).unsqueeze(0),
       lambda x: x[None], [Case("2d", [F(X34)])]),
    Op("expand", lambda lib, x: x.expand(2, 3, 4), lambda x: np.broadcast_to(x, (2, 3, 4)),
       [Case("row", [F((1, 4))]), Case("col", [F((3, 1))])]),
    Op("contiguous", lambda lib, x: x.contiguous(), lambda x: x, [Case("2d", [F(X34)])]),
    Op("clone", lambda lib, x: x.clone(), lambda x: x, [Case("3d", [F(X234)])]),
    Op("as_strided", lambda lib, x: x.as_strided((2, 3), (1, 4), 1),
       lambda x: np.lib.stride_tricks.as_strided(x.ravel()[1:], (2, 3), (8, 32)).copy(),
       [Case("1d", [F((12,))])], layouts=False, backward=False),  # a raw alias: not recorded
    # The reduction behind every broadcast backward (torch spells it sum_to_size).
    Op("sum_to", lambda lib, x, shape: lib.ops.sum_to(x, shape),
       lambda x, shape: np_sum_to(x, shape),
       [Case("rows", [F(X234)], dict(shape=(1, 3, 1))),
        Case("lead", [F(X234)], dict(shape=(2, 1, 4))),
        Case("rank_drop", [F(X234)], dict(shape=(3, 4)))],
       torch_fn=lambda torch, x, shape: x.sum_to_size(*shape)),
    # ---- rotary ----
    Op("apply_rotary", lambda lib, x, c, s: _F(lib).apply_rotary(x, c, s),
       lambda x, c, s: np_rotary(x, c, s),
       [Case("bthd", [F((2, 5, 2, 8)),
                      F((5, 4), grad=False, fixed_dtype="float32", layouts=(),
                        gen=lambda r, sh: rope_tables(5, 8)[0]),
                      F((5, 4), grad=False, fixed_dtype="float32", layouts=(),
                        gen=lambda r, sh: rope_tables(5, 8)[1])]),
        Case("odd_t", [F((1, 3, 3, 4)),
                       F((3, 2), grad=False, fixed_dtype="float32", layouts=(),
                         gen=lambda r, sh: rope_tables(3, 4, 100.0, 7)[0]),
                       F((3, 2), grad=False, fixed_dtype="float32", layouts=(),
                         gen=lambda r, sh: rope_tables(3, 4, 100.0, 7)[1])])],
       torch_fn=lambda torch, x, c, s: t_rotary(torch, x, c, s)),
    # ---- attention ----
    Op("sdpa", lambda lib, q, k, v, *m, **kw: _F(lib).scaled_dot_product_attention(
        q, k, v, attn_mask=(m[0] if m else None), **kw),
       lambda q, k, v, *m, **kw: np_sdpa(q, k, v, *m, **kw),
       [Case("noncausal", [F((1, 2, 5, 4)), F((1, 2, 5, 4)), F((1, 2, 5, 4))]),
        Case("causal", [F((2, 2, 4, 4)), F((2, 2, 4, 4)), F((2, 2, 4, 4))], dict(is_causal=True)),
        Case("causal_tq_lt_tk", [F((1, 2, 3, 4)), F((1, 2, 6, 4)), F((1, 2, 6, 4))],
             dict(is_causal=True)),
        Case("gqa_causal", [F((1, 4, 4, 4)), F((1, 2, 4, 4)), F((1, 2, 4, 4))],
             dict(is_causal=True)),
        Case("gqa_noncausal_scale", [F((1, 4, 3, 4)), F((1, 1, 5, 4)), F((1, 1, 5, 4))],
             dict(scale=0.3)),
        Case("float_mask", [F((1, 2, 4, 4)), F((1, 2, 5, 4)), F((1, 2, 5, 4)),
                            F((4, 5), grad=False, layouts=(), gen=_float_mask)]),
        # True = attend (torch's convention); the diagonal keeps every row non-empty.
        Case("bool_mask_bcast", [F((2, 2, 4, 4)), F((2, 2, 4, 4)), F((2, 2, 4, 4)),
                                 M((1, 1, 4, 4), gen=lambda r: (r.random((1, 1, 4, 4)) < 0.6)
                                   | np.eye(4, dtype=bool))]),
        Case("bool_mask_is_causal_pattern",
             [F((1, 2, 5, 4)), F((1, 2, 5, 4)), F((1, 2, 5, 4)),
              M((5, 5), gen=lambda r: np.tril(np.ones((5, 5), bool)))]),
        Case("long_kv", [F((1, 1, 2, 4)), F((1, 1, 70, 4)), F((1, 1, 70, 4))])],
       torch_fn=lambda torch, q, k, v, *m, **kw: t_sdpa(torch, q, k, v, *m, **kw)),
]


def all_cases():
    for op in OPS:
        for case in op.cases:
            yield op, case
