"""The Python Tensor API against PyTorch: creation, views, indexing, operators, conversions,
numpy interop (memory sharing), reductions, random state and memory statistics.

Exact comparisons (==) are used where both libraries compute the same float32 operation on the
same inputs (copies, views, one rounding per element); reductions use rtol 1e-5 (float32 sums of
a few dozen terms in a different order differ by a few ulps).
"""
import gc
import threading

import numpy as np
import pytest
import torch

import tardelli as td


def as_np(t):
    return np.asarray(t.detach().float()) if isinstance(t, td.Tensor) else t.detach().numpy()


def pair(shape, seed=0, dtype=np.float32):
    """The same random values as a tardelli and a torch tensor."""
    a = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return td.tensor(a), torch.tensor(a)


# ---- creation ----


def test_factories_shapes_and_dtypes():
    # Property: size may be varargs, a tuple or a list, and dtypes default like torch.
    assert td.zeros(2, 3).shape == td.zeros((2, 3)).shape == td.zeros([2, 3]).shape == (2, 3)
    assert td.ones(4).dtype == td.float32
    assert np.all(td.ones(2, 2).numpy() == 1)
    assert td.full((2,), 7).dtype == td.int64  # torch infers int64 from an int fill value
    assert td.full((2,), 1.5).dtype == td.float32
    assert td.full((2,), True).dtype == td.bool
    assert td.arange(5).dtype == td.int64
    assert td.arange(0, 1, 0.25).dtype == td.float32
    assert td.arange(0, 1, 0.25).tolist() == torch.arange(0, 1, 0.25).tolist()
    assert td.arange(2, 11, 3).tolist() == torch.arange(2, 11, 3).tolist()
    assert td.empty(3, dtype=td.bfloat16).dtype == td.bfloat16
    x = td.zeros(2, 3, dtype=td.int32)
    assert td.ones_like(x).dtype == td.int32 and td.ones_like(x).shape == (2, 3)
    assert td.zeros_like(x, dtype=td.float16).dtype == td.float16
    assert td.full_like(x, 4).tolist() == [[4, 4, 4], [4, 4, 4]]
    assert td.zeros(2, requires_grad=True).requires_grad


def test_tensor_infers_dtype_like_torch():
    # Property: td.tensor infers the same dtype as torch.tensor for Python and numpy data.
    cases = [[1, 2, 3], [1.5, 2.0], [True, False], np.arange(3, dtype=np.int32),
             np.ones(2, dtype=np.float16), 3.0, 7]
    names = {torch.float32: td.float32, torch.int64: td.int64, torch.bool: td.bool,
             torch.int32: td.int32, torch.float16: td.float16}
    for data in cases:
        assert td.tensor(data).dtype == names[torch.tensor(data).dtype], data
    assert td.tensor(np.arange(4.0)).dtype == td.float32  # float64 data becomes float32
    assert td.tensor([[1, 2], [3, 4]], dtype=td.bfloat16).dtype == td.bfloat16
    t = td.tensor([1.0, 2.0], requires_grad=True)
    assert t.requires_grad and t.is_leaf


def test_tensor_copies_but_from_numpy_shares():
    # Property: tensor() copies its data; from_numpy() shares memory both ways.
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    copied, shared = td.tensor(a), td.from_numpy(a)
    a[0, 0] = 100.0
    assert copied[0, 0].item() == 0.0
    assert shared[0, 0].item() == 100.0
    with td.no_grad():
        shared.add_(td.ones(2, 3))
    assert a[1, 2] == 6.0
    assert shared.data_ptr() == a.ctypes.data


def test_from_numpy_keeps_array_alive_and_handles_strides():
    # Property: the tensor owns a reference to the array (deleting the array is safe), and
    # strided arrays map to strided tensors over the same memory.
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    t = td.from_numpy(a[:, ::2])
    assert t.stride() == (4, 2) and t.shape == (3, 2)
    del a
    gc.collect()
    assert t.tolist() == [[0, 2], [4, 6], [8, 10]]
    f16 = td.from_numpy(np.array([1.5, -2.0], dtype=np.float16))
    assert f16.dtype == td.float16 and f16.tolist() == [1.5, -2.0]


def test_numpy_shares_memory():
    # Property: numpy() views the tensor's memory; writes go both ways; the array keeps the
    # storage alive after the tensor is gone.
    t = td.zeros(2, 3)
    a = t.numpy()
    a[1, 1] = 5.0
    assert t[1, 1].item() == 5.0
    t.fill_(2.0)
    assert np.all(a == 2.0)
    t2 = td.arange(6).reshape(2, 3)
    v = t2.numpy()
    del t2
    gc.collect()
    assert v.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_numpy_of_views_is_strided_and_shared():
    # Property: a transposed or sliced tensor gives a strided array over the same memory.
    t = td.arange(12, dtype=td.float32).reshape(3, 4)
    tt = t.t()
    a = tt.numpy()
    assert a.shape == (4, 3) and not a.flags.c_contiguous
    np.testing.assert_array_equal(a, np.arange(12, dtype=np.float32).reshape(3, 4).T)
    a[0, 2] = -1.0
    assert t[2, 0].item() == -1.0
    s = t[:, 1::2].numpy()
    np.testing.assert_array_equal(s, t.numpy()[:, 1::2])
    assert td.ones(2, dtype=td.float16).numpy().dtype == np.float16
    assert td.ones(2, dtype=td.bool).numpy().dtype == np.bool_


# ---- views and shape ----


def test_shape_is_a_size_tuple():
    t = td.zeros(2, 3, 4)
    assert isinstance(t.shape, tuple) and isinstance(t.shape, td.Size)
    assert t.shape == torch.zeros(2, 3, 4).shape
    assert t.size() == (2, 3, 4) and t.size(-1) == 4 and t.size(1) == 3
    assert t.dim() == t.ndim == 3 and t.numel() == 24 and len(t) == 2
    assert repr(t.shape) == "tardelli.Size([2, 3, 4])"
    assert t.shape.numel() == 24


def test_views_match_torch():
    # Property: view ops give the same values and strides as torch and share memory.
    x, tx = pair((2, 3, 4))
    cases = [
        (lambda a: a.view(6, 4), lambda a: a.view(6, 4)),
        (lambda a: a.view((4, -1)), lambda a: a.view((4, -1))),
        (lambda a: a.reshape(-1), lambda a: a.reshape(-1)),
        (lambda a: a.permute(2, 0, 1), lambda a: a.permute(2, 0, 1)),
        (lambda a: a.transpose(0, 2), lambda a: a.transpose(0, 2)),
        (lambda a: a.narrow(1, 1, 2), lambda a: a.narrow(1, 1, 2)),
        (lambda a: a.select(2, -1), lambda a: a.select(2, -1)),
        (lambda a: a.unsqueeze(1), lambda a: a.unsqueeze(1)),
        (lambda a: a.unsqueeze(0).squeeze(0), lambda a: a.unsqueeze(0).squeeze(0)),
        (lambda a: a.flatten(1), lambda a: a.flatten(1)),
        (lambda a: a[:, :1].expand(2, 3, 4), lambda a: a[:, :1].expand(2, 3, 4)),
        (lambda a: a.T, lambda a: a.permute(2, 1, 0)),
        (lambda a: a[0].t(), lambda a: a[0].t()),
        (lambda a: a.mT, lambda a: a.transpose(-2, -1)),
    ]
    for f, g in cases:
        r, tr = f(x), g(tx)
        assert r.shape == tr.shape
        assert r.stride() == tr.stride()
        np.testing.assert_array_equal(as_np(r), as_np(tr))
        assert r._storage_ptr() == x._storage_ptr()  # a view, not a copy
    assert x.transpose(0, 1).is_contiguous() is False
    c = x.transpose(0, 1).contiguous()
    assert c.is_contiguous() and c.stride() == tx.transpose(0, 1).contiguous().stride()
    assert x.view_as(td.zeros(4, 6)).shape == (4, 6)
    assert x[:, :1].expand_as(x).shape == (2, 3, 4)


# ---- indexing ----

INDEX_KEYS = [
    1, -1, (0, 2), (slice(None), 1), slice(1, None), slice(None, None, 2), slice(-2, None),
    (Ellipsis, 1), (None, 0), (0, None, slice(None), None), (slice(None, None, 3), Ellipsis, 0),
    (1, slice(0, 3, 2), -1), slice(5, 10), (Ellipsis,), (slice(None), None, Ellipsis),
]


@pytest.mark.parametrize("key", INDEX_KEYS, ids=[repr(k) for k in INDEX_KEYS])
def test_getitem_basic_matches_torch(key):
    # Property: ints, slices (with steps and negative bounds), None and Ellipsis select the same
    # elements with the same shape and strides as torch, as views.
    x, tx = pair((3, 4, 5))
    r, tr = x[key], tx[key]
    assert r.shape == tr.shape
    assert r.stride() == tr.stride()
    np.testing.assert_array_equal(as_np(r), as_np(tr))


def test_getitem_tensor_and_mask_match_torch():
    # Property: int tensors / lists select along a dim (negative indices allowed) and bool masks
    # select elements, like torch's advanced indexing with a single index.
    x, tx = pair((4, 5))
    idx = [3, -1, 0, 3]
    np.testing.assert_array_equal(as_np(x[td.tensor(idx)]), as_np(tx[torch.tensor(idx)]))
    np.testing.assert_array_equal(as_np(x[idx]), as_np(tx[idx]))
    np.testing.assert_array_equal(as_np(x[:, td.tensor([4, 1])]),
                                  as_np(tx[:, torch.tensor([4, 1])]))
    two_d = [[0, 1], [2, 3]]
    assert x[td.tensor(two_d)].shape == tx[torch.tensor(two_d)].shape == (2, 2, 5)
    np.testing.assert_array_equal(as_np(x[td.tensor(two_d)]), as_np(tx[torch.tensor(two_d)]))
    mask = x > 0.2
    np.testing.assert_array_equal(as_np(x[mask]), as_np(tx[tx > 0.2]))
    row_mask = td.tensor([True, False, True, True])
    np.testing.assert_array_equal(as_np(x[row_mask]),
                                  as_np(tx[torch.tensor([True, False, True, True])]))


def test_getitem_gradient_matches_torch():
    # Property: gradients flow through basic and tensor indexing like torch (repeated indices add).
    a = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    x = td.tensor(a, requires_grad=True)
    tx = torch.tensor(a, requires_grad=True)
    (x[1:, ::2].sum() + (x[td.tensor([0, 0, 3])] * 2).sum() + x[-1, 1]).backward()
    (tx[1:, ::2].sum() + (tx[torch.tensor([0, 0, 3])] * 2).sum() + tx[-1, 1]).backward()
    np.testing.assert_array_equal(as_np(x.grad), tx.grad.numpy())


def test_setitem_matches_torch():
    # Property: assignment through basic indexing, masks and int indices writes the same
    # elements as torch, in place.
    x, tx = pair((4, 5))
    ptr = x.data_ptr()
    for key, val in [((1, slice(None)), 3.0), ((slice(None), 2), -1.0), ((Ellipsis, 0), 0.5)]:
        x[key] = val
        tx[key] = val
    x[2:, 1:3] = td.tensor([[7.0, 8.0]])
    tx[2:, 1:3] = torch.tensor([[7.0, 8.0]])
    x[x > 1.0] = 9.0
    tx[tx > 1.0] = 9.0
    x[[0, 3]] = -2.0
    tx[[0, 3]] = -2.0
    x[1] = [1.0, 2.0, 3.0, 4.0, 5.0]
    tx[1] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(as_np(x), tx.numpy())
    assert x.data_ptr() == ptr


def test_len_iter_bool_item_tolist():
    x = td.tensor([[1, 2], [3, 4]])
    assert len(x) == 2
    assert [r.tolist() for r in x] == [[1, 2], [3, 4]]
    assert x.tolist() == [[1, 2], [3, 4]]
    assert x[1, 0].item() == 3 and isinstance(x[1, 0].item(), int)
    assert isinstance(td.tensor(2.5).item(), float) and isinstance(td.tensor(True).item(), bool)
    assert bool(td.tensor([1.0])) and not bool(td.tensor(0.0))
    assert float(td.tensor(2.5)) == 2.5 and int(td.tensor(7)) == 7
    assert f"{td.tensor(1.23456):.2f}" == "1.23"
    assert td.tensor(3.0, dtype=td.bfloat16).tolist() == 3.0
    assert list(range(10))[td.tensor(4)] == 4  # __index__


def test_repr():
    assert repr(td.tensor([1.0, 2.0])) == "tensor([1.0000, 2.0000])"
    assert "dtype=bfloat16" in repr(td.ones(2, dtype=td.bfloat16))
    assert "requires_grad=True" in repr(td.ones(2, requires_grad=True))
    assert "grad_fn=<" in repr(td.ones(2, requires_grad=True) * 2)
    assert repr(td.float32) == "tardelli.float32" and str(td.bfloat16) == "tardelli.bfloat16"


# ---- operators ----

BINOPS = [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b,
    lambda a, b: a ** b, lambda a, b: a @ b,
    lambda a, b: a == b, lambda a, b: a != b, lambda a, b: a > b, lambda a, b: a < b,
    lambda a, b: a >= b, lambda a, b: a <= b,
]


@pytest.mark.parametrize("op", range(len(BINOPS)))
def test_binary_operators_match_torch(op):
    # Property: operators on two tensors (with broadcasting) agree with torch in value and dtype.
    f = BINOPS[op]
    a = np.abs(np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)) + 0.5
    b = np.round(np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32), 1)
    if op != 5:  # matmul takes [3,4] @ [4,4]; the others broadcast a row
        b = b[:1]
    r, tr = f(td.tensor(a), td.tensor(b)), f(torch.tensor(a), torch.tensor(b))
    assert r.shape == tr.shape
    assert str(r.dtype).split(".")[1] == str(tr.dtype).split(".")[1]
    np.testing.assert_allclose(as_np(r), tr.numpy().astype(np.float32), rtol=1e-6, atol=1e-6)


SCALAR_OPS = [
    lambda a: a + 2, lambda a: 2 + a, lambda a: a - 1.5, lambda a: 1.5 - a, lambda a: a * 3,
    lambda a: -0.5 * a, lambda a: a / 4, lambda a: 4 / a, lambda a: a ** 2, lambda a: 2 ** a,
    lambda a: -a, lambda a: a > 1, lambda a: a == 2, lambda a: 1 < a, lambda a: a != 2.5,
    lambda a: abs(a),
]


@pytest.mark.parametrize("op", range(len(SCALAR_OPS)))
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_scalar_operators_match_torch(op, dtype):
    # Property: Python scalars on either side give torch's values and result dtypes (an integral
    # tensor with a float scalar becomes float32, true division always floats).
    f = SCALAR_OPS[op]
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype=dtype)
    r, tr = f(td.tensor(a)), f(torch.tensor(a))
    if dtype == "int64" and op in (8, 9):  # pow of/with an int tensor: computed in float
        tr = tr.float()
    else:
        assert str(r.dtype).split(".")[1] == str(tr.dtype).split(".")[1]
    np.testing.assert_allclose(as_np(r).astype(np.float64), tr.numpy().astype(np.float64),
                               rtol=1e-6)


def test_numpy_operands_stay_tensors():
    # Property: numpy scalars and arrays combine with tensors into tensors (not ndarrays), so
    # autograd is not silently lost.
    x = td.ones(2, requires_grad=True)
    for r in [np.float64(2.0) * x, np.float32(1.0) + x, x * np.float64(3.0),
              x + np.array([1.0, 2.0], dtype=np.float32)]:
        assert isinstance(r, td.Tensor) and r.requires_grad


def test_subclass_shares_the_tensor():
    # Property: Tensor(t) is a new handle to the same tensor, so Python subclasses (parameters)
    # can wrap existing tensors.
    class Param(td.Tensor):
        pass

    t = td.zeros(3)
    p = Param(t)
    assert isinstance(p, td.Tensor) and p._impl_id() == t._impl_id()
    p.requires_grad_()
    assert t.requires_grad


def test_inplace_operators_modify_in_place():
    # Property: += -= *= /= update the same tensor (like torch), not a rebound copy.
    x = td.ones(2, 2)
    alias = x
    x += 1
    x -= td.tensor([0.5, 0.0])
    x *= 4
    x /= 2
    assert alias is x
    np.testing.assert_array_equal(x.numpy(), [[3.0, 4.0], [3.0, 4.0]])
    y = td.zeros(3)
    assert y.add_(td.ones(3), alpha=2) is y and y.mul_(1.5) is y
    assert y.tolist() == [3.0, 3.0, 3.0]
    assert y.zero_() is y and y.fill_(7) is y and y.tolist() == [7.0] * 3
    assert y.copy_(td.arange(3)) is y and y.tolist() == [0.0, 1.0, 2.0]


# ---- conversions ----


def test_dtype_conversions_match_torch_rounding():
    # Property: float -> bf16 / f16 rounds to nearest even exactly like torch; int casts
    # truncate like torch.
    a = np.random.default_rng(4).standard_normal(1000).astype(np.float32) * 100
    x, tx = td.tensor(a), torch.tensor(a)
    np.testing.assert_array_equal(as_np(x.bfloat16()), tx.bfloat16().float().numpy())
    np.testing.assert_array_equal(as_np(x.to(td.bfloat16)), tx.bfloat16().float().numpy())
    np.testing.assert_array_equal(x.half().numpy(), tx.half().numpy())
    np.testing.assert_array_equal(x.long().numpy(), tx.long().numpy())
    np.testing.assert_array_equal(x.int().numpy(), tx.int().numpy())
    assert x.to(td.float32) is x and x.to("cpu") is x
    assert x.to(td.float16).dtype == td.float16 and x.to(dtype=td.int64).dtype == td.int64
    assert x.to(td.zeros(1, dtype=td.int32)).dtype == td.int32
    assert x.to(td.float32, copy=True)._storage_ptr() != x._storage_ptr()
    assert x.type_as(td.zeros(1, dtype=td.float16)).dtype == td.float16
    assert x.device == td.device("cpu") and x.device == "cpu" and x.device.type == "cpu"


def test_clone_and_detach():
    x = td.ones(3, requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and d._storage_ptr() == x._storage_ptr()
    c = x.clone()
    assert c.requires_grad and c.grad_fn is not None and c._storage_ptr() != x._storage_ptr()


# ---- reductions and functions ----


def test_reductions_match_torch():
    # Property: sum/mean/max/min/argmax/amax/var/norm agree with torch (values, shapes, the
    # named-tuple results of max/min along a dim).
    x, tx = pair((3, 4, 5), seed=5)
    close = dict(rtol=1e-5, atol=1e-6)
    for f in [lambda a: a.sum(), lambda a: a.sum(1), lambda a: a.sum((0, 2), keepdim=True),
              lambda a: a.mean(-1), lambda a: a.mean(dim=(1,), keepdim=True),
              lambda a: a.var(), lambda a: a.var(1), lambda a: a.norm(),
              lambda a: a.amax(2), lambda a: a.max(), lambda a: a.min()]:
        r, tr = f(x), f(tx)
        assert r.shape == tr.shape
        np.testing.assert_allclose(as_np(r), as_np(tr), **close)
    np.testing.assert_allclose(as_np(td.var(x, 0, correction=0)),
                               as_np(torch.var(tx, 0, unbiased=False)), **close)
    m, tm = x.max(1), tx.max(1)
    assert m._fields == ("values", "indices")
    np.testing.assert_array_equal(as_np(m.values), as_np(tm.values))
    np.testing.assert_array_equal(as_np(m.indices), tm.indices.numpy())
    n, tn = td.min(x, dim=2, keepdim=True), torch.min(tx, dim=2, keepdim=True)
    np.testing.assert_array_equal(as_np(n.values), as_np(tn.values))
    np.testing.assert_array_equal(as_np(n.indices), tn.indices.numpy())
    assert x.argmax().item() == tx.argmax().item()
    np.testing.assert_array_equal(as_np(x.argmax(1)), tx.argmax(1).numpy())
    y, ty = pair((3, 4, 5), seed=6)
    np.testing.assert_array_equal(as_np(td.max(x, y)), as_np(torch.max(tx, ty)))


def test_top_level_functions_match_torch():
    x, tx = pair((2, 6), seed=7)
    for name in ["exp", "tanh", "sigmoid", "abs", "relu", "sin", "cos"]:
        np.testing.assert_allclose(as_np(getattr(td, name)(x)), as_np(getattr(torch, name)(tx)),
                                   rtol=1e-6, atol=1e-6)
    p, tp = x.abs() + 0.1, tx.abs() + 0.1
    for name in ["log", "sqrt", "rsqrt"]:
        np.testing.assert_allclose(as_np(getattr(td, name)(p)), as_np(getattr(torch, name)(tp)),
                                   rtol=1e-6)
        np.testing.assert_allclose(as_np(getattr(p, name)()), as_np(getattr(tp, name)()),
                                   rtol=1e-6)
    np.testing.assert_allclose(as_np(td.softmax(x, -1)), as_np(torch.softmax(tx, -1)), rtol=1e-6)
    np.testing.assert_allclose(as_np(x.log_softmax(1)), as_np(tx.log_softmax(1)), rtol=1e-5)
    np.testing.assert_allclose(as_np(td.matmul(x, x.t())), as_np(torch.matmul(tx, tx.t())),
                               rtol=1e-5)
    assert td.tril(td.ones(3, 3)).tolist() == torch.tril(torch.ones(3, 3)).tolist()
    assert td.triu(td.ones(3, 3), 1).tolist() == torch.triu(torch.ones(3, 3), 1).tolist()
    np.testing.assert_array_equal(as_np(td.where(x > 0, x, 0.0)),
                                  as_np(torch.where(tx > 0, tx, torch.tensor(0.0))))
    np.testing.assert_array_equal(as_np(x.masked_fill(x < 0, -1.0)),
                                  as_np(tx.masked_fill(tx < 0, -1.0)))
    np.testing.assert_array_equal(as_np(td.cat([x, x], 1)), as_np(torch.cat([tx, tx], 1)))
    np.testing.assert_array_equal(as_np(td.stack([x, x])), as_np(torch.stack([tx, tx])))
    for a, b in zip(x.split(4, 1), tx.split(4, 1)):
        np.testing.assert_array_equal(as_np(a), as_np(b))
    for a, b in zip(td.split(x, [1, 5], 1), torch.split(tx, [1, 5], 1)):
        np.testing.assert_array_equal(as_np(a), as_np(b))
    assert [c.shape for c in x.chunk(3, 1)] == [c.shape for c in tx.chunk(3, 1)]


def test_functional_matches_torch():
    F = td.nn.functional
    tF = torch.nn.functional
    x, tx = pair((2, 3, 8), seed=8)
    np.testing.assert_allclose(as_np(F.gelu(x, approximate="tanh")),
                               as_np(tF.gelu(tx, approximate="tanh")), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(as_np(F.silu(x)), as_np(tF.silu(tx)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(as_np(F.layer_norm(x, 8)), as_np(tF.layer_norm(tx, (8,))),
                               rtol=1e-4, atol=1e-5)
    w, tw = pair((5, 8), seed=9)
    np.testing.assert_allclose(as_np(F.linear(x, w)), as_np(tF.linear(tx, tw)), rtol=1e-5,
                               atol=1e-6)
    idx = td.tensor([[0, 4], [2, 2]])
    np.testing.assert_array_equal(as_np(F.embedding(idx, w)),
                                  as_np(tF.embedding(torch.tensor([[0, 4], [2, 2]]), tw)))
    # torch's [N, C, d] layout for cross entropy (classes in dim 1).
    logits, tlogits = pair((2, 5, 3), seed=10)
    tgt = np.array([[0, 4, 1], [2, -100, 3]])
    np.testing.assert_allclose(
        F.cross_entropy(logits, td.tensor(tgt)).item(),
        tF.cross_entropy(tlogits, torch.tensor(tgt)).item(), rtol=1e-5)
    np.testing.assert_allclose(
        as_np(F.cross_entropy(logits, td.tensor(tgt), reduction="none", label_smoothing=0.1)),
        as_np(tF.cross_entropy(tlogits, torch.tensor(tgt), reduction="none",
                               label_smoothing=0.1)), rtol=1e-5, atol=1e-6)
    q, tq = pair((1, 2, 4, 8), seed=11)
    # torch 1.13 has no scaled_dot_product_attention: spell it out.
    scores = tq @ tq.transpose(-2, -1) / 8 ** 0.5
    scores = scores.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))
    np.testing.assert_allclose(as_np(F.scaled_dot_product_attention(q, q, q, is_causal=True)),
                               as_np(torch.softmax(scores, -1) @ tq), rtol=1e-4, atol=1e-5)
    assert F.dropout(x, 0.5, training=False) is not None
    np.testing.assert_array_equal(as_np(F.dropout(x, 0.5, training=False)), as_np(x))


def test_rope_and_adamw_helpers():
    # Property: rope_cache follows the documented angle t * base^(-2i/D); adamw_step matches the
    # AdamW formula of ops/adamw.h for one step, in place, single and multi-tensor forms.
    cos, sin = td.rope_cache(5, 8, base=100.0)
    ang = np.arange(5)[:, None] * 100.0 ** (-2.0 * np.arange(4)[None, :] / 8)
    np.testing.assert_allclose(cos.numpy(), np.cos(ang), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sin.numpy(), np.sin(ang), rtol=1e-5, atol=1e-6)
    x = td.randn(1, 5, 2, 8)
    y = td.nn.functional.apply_rotary(x, cos, sin)
    np.testing.assert_allclose(y.pow(2).sum(-1).numpy(), x.pow(2).sum(-1).numpy(), rtol=1e-5)

    rng = np.random.default_rng(12)
    p0, g = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    cfg = dict(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, step=1)
    m = (1 - 0.9) * g
    v = (1 - 0.99) * g * g
    want = p0 - 0.1 * (m / 0.1) / (np.sqrt(v / 0.01) + 1e-8) - 0.1 * 0.1 * p0
    p, ea, eas = td.tensor(p0), td.zeros(6), td.zeros(6)
    td.ops.adamw_step(p, td.tensor(g), ea, eas, **cfg)
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ea.numpy(), m, rtol=1e-6)
    ps = [td.tensor(p0), td.tensor(p0[:3])]
    td.ops.adamw_step(ps, [td.tensor(g), td.tensor(g[:3])], [td.zeros(6), td.zeros(3)],
                      [td.zeros(6), td.zeros(3)], **cfg)
    np.testing.assert_allclose(ps[0].numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ps[1].numpy(), want[:3], rtol=1e-5, atol=1e-6)


# ---- random state, memory, threads ----


def test_manual_seed_and_generators():
    # Property: the same seed reproduces the same draws; generators are independent streams.
    td.manual_seed(123)
    a = td.randn(4, 4)
    td.manual_seed(123)
    b = td.randn(4, 4)
    assert a.tolist() == b.tolist()
    g1, g2 = td.Generator(), td.Generator()
    assert g1.manual_seed(7) is g1
    g2.manual_seed(7)
    assert td.rand(10, generator=g1).tolist() == td.rand(10, generator=g2).tolist()
    assert g1.initial_seed() == 7
    r = td.randint(3, 9, (1000,), generator=g1)
    assert r.dtype == td.int64 and r.min().item() >= 3 and r.max().item() <= 8
    u = td.rand(1000, generator=g1).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0
    assert td.randint(5, (3,)).shape == (3,)
    assert td.manual_seed(1) is not None


def test_all_any_equal_match_torch():
    # Property: td.all/any (whole tensor and along dims, keepdim) and td.equal give torch's
    # answers, including empty tensors (all of nothing is True, any of nothing False) and bools.
    x = np.array([[0.0, 1.5, -2.0], [3.0, 0.0, 0.0], [1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
    for arr in (x, x.astype(np.int64), x != 0, np.zeros((0, 3), np.float32)):
        a, t = td.tensor(arr), torch.tensor(arr)
        for fn in ("all", "any"):
            assert bool(getattr(a, fn)()) == bool(getattr(t, fn)())
            assert getattr(td, fn)(a).dtype == td.bool
            for dim in (0, 1, -1):
                for keepdim in (False, True):
                    got = getattr(a, fn)(dim, keepdim)
                    want = getattr(t, fn)(dim, keepdim=keepdim)
                    assert tuple(got.shape) == tuple(want.shape)
                    assert got.tolist() == want.tolist()
    a = td.tensor(x)
    assert td.equal(a, a.clone()) and not td.equal(a, a + 1) and not td.equal(a, a[:2])


def test_generator_split_is_an_independent_reproducible_stream():
    # Property: split(i) returns a new generator with the parent's seed and its own subsequence;
    # the same index reproduces the same draws, another index or the parent draws differently,
    # and splitting does not advance the parent.
    g = td.Generator(11)
    s1, s1b, s2 = g.split(1), g.split(1), g.split(2)
    assert isinstance(s1, td.Generator) and s1 is not s1b
    assert s1.initial_seed() == 11 and s1.subsequence != g.subsequence
    a, b = td.rand(64, generator=s1).tolist(), td.rand(64, generator=s1b).tolist()
    assert a == b
    assert a != td.rand(64, generator=s2).tolist()
    assert g.offset == 0
    assert a != td.rand(64, generator=g).tolist()


def test_memory_stats_track_allocations():
    # Property: a 4 MiB tensor raises current_bytes by at least its size while alive, and
    # freeing it gives the bytes back.
    gc.collect()
    before = td.memory_stats()["current_bytes"]
    t = td.empty(1 << 20)
    during = td.memory_stats()
    assert during["current_bytes"] - before >= 4 << 20
    assert during["peak_bytes"] >= during["current_bytes"]
    del t
    gc.collect()
    assert td.memory_stats()["current_bytes"] - before < 4 << 20
    td.reset_peak_memory_stats()
    assert td.memory_stats()["peak_bytes"] == td.memory_stats()["current_bytes"]


def test_ops_run_concurrently_from_threads():
    # Property: ops release the GIL without breaking anything: several Python threads running
    # matmul + backward at once all get the single-threaded results. (Up to rounding: oneDNN's
    # GEMM blocking depends on the OpenMP team size, which differs in concurrent threads.)
    a = np.random.default_rng(13).standard_normal((64, 64)).astype(np.float32)
    want = td.tensor(a) @ td.tensor(a)
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                x = td.tensor(a, requires_grad=True)
                y = x @ x
                y.sum().backward()
                results.append(np.abs(y.detach().numpy() - want.numpy()).max())
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 20 and max(results) <= 1e-5 * np.abs(want.numpy()).max()
