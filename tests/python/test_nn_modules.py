"""td.nn.Module and layers against torch.nn: registration semantics, traversal order, state_dict
keys and strict loading, train/eval, zero_grad, dtype conversion, layer outputs and gradients.

Layer outputs and gradients are compared to torch with weights copied across (load_state_dict)
at rtol 1e-5 / atol 1e-6: both sides evaluate the same float32 formula, differing only in
summation order (GEMM blocking, fused norms), a few ulps for these sizes (K <= 64).
"""
import collections
import math

import numpy as np
import pytest
import torch

import tardelli as td

tnn, dnn = torch.nn, td.nn


def as_np(t):
    return np.asarray(t.detach().float()) if isinstance(t, td.Tensor) else t.detach().numpy()


def copy_from_torch(dm, tm):
    dm.load_state_dict({k: td.tensor(v.numpy()) for k, v in tm.state_dict().items()})


def tree(nn):
    """The same small module tree built from either library."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 16), nn.GELU(),
                                                       nn.Linear(16, 8, bias=False))
                                         for _ in range(2)])
            self.norms = nn.ModuleDict({"pre": nn.LayerNorm(8), "post": nn.LayerNorm(8)})
            self.drop = nn.Dropout(0.25)
            self.head = nn.Linear(8, 10, bias=False)
            self.head.weight = self.emb.weight  # tied
            self.register_buffer("mask", torch.ones(3) if nn is tnn else td.ones(3))
            self.register_buffer("scratch", torch.zeros(2) if nn is tnn else td.zeros(2),
                                 persistent=False)

        def forward(self, idx):
            x = self.norms["pre"](self.emb(idx))
            for b in self.blocks:
                x = x + b(x)
            return self.head(self.drop(self.norms["post"](x)))

    return Net()


# ---- Parameter ----


def test_parameter_is_a_tensor_sharing_the_impl():
    # Property: Parameter(t) is the same C++ tensor (same storage and impl), a leaf requiring
    # grad by default; ops on it give plain tensors; a non-leaf is detached first.
    t = td.randn(3, 2)
    p = dnn.Parameter(t)
    assert isinstance(p, td.Tensor) and isinstance(p, dnn.Parameter)
    assert p._impl_id() == t._impl_id() and p.requires_grad and p.is_leaf
    assert type(p * 2) is td.Tensor
    assert not dnn.Parameter(td.zeros(2), requires_grad=False).requires_grad
    assert repr(p).startswith("Parameter containing:\ntensor(")
    q = dnn.Parameter(p * 2)
    assert q.is_leaf and q.grad_fn is None
    with pytest.raises(TypeError):
        dnn.Parameter(np.zeros(2))


# ---- registration ----


def test_setattr_registers_parameters_modules_and_buffers():
    # Property: torch's __setattr__ contract.
    m = dnn.Module()
    m.w = dnn.Parameter(td.zeros(2))
    m.sub = dnn.Linear(2, 3)
    m.plain = td.zeros(4)  # a plain tensor is an ordinary attribute, not a parameter
    m.register_buffer("buf", td.ones(1))
    assert list(m._parameters) == ["w"] and list(m._modules) == ["sub"]
    assert list(m._buffers) == ["buf"] and "plain" in m.__dict__
    assert [n for n, _ in m.named_parameters()] == ["w", "sub.weight", "sub.bias"]
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'w'"):
        m.w = td.zeros(2)
    with pytest.raises(TypeError, match="child module 'sub'"):
        m.sub = 3
    m.buf = td.zeros(1)  # buffers may be reassigned with tensors
    assert m.buf.item() == 0.0
    m.w = None  # None keeps the slot: skipped by traversal and state_dict
    assert "w" in m._parameters and m.w is None
    assert "w" not in m.state_dict()
    with pytest.raises(TypeError, match="as parameter 'w'"):
        m.w = dnn.Linear(1, 1)  # torch refuses a module under a parameter's name too
    del m.w
    m.w = dnn.Linear(1, 1)
    assert "w" not in m._parameters and "w" in m._modules
    del m.sub
    assert "sub" not in m._modules
    with pytest.raises(AttributeError, match="has no attribute 'sub'"):
        m.sub
    with pytest.raises(KeyError, match="contain"):
        m.register_parameter("a.b", None)
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("plain", td.zeros(1))
    with pytest.raises(TypeError, match="Parameter or None required"):
        m.register_parameter("x", td.zeros(1))

    class Early(dnn.Module):
        def __init__(self):
            self.w = dnn.Parameter(td.zeros(1))  # before super().__init__()

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Early()


def test_traversal_order_matches_torch():
    # Property: named_parameters / named_buffers / named_modules / named_children follow
    # torch's order; the tied weight and a shared module are listed once.
    torch.manual_seed(0)
    tm, dm = tree(tnn), tree(dnn)
    names = lambda it: [n for n, _ in it]  # noqa: E731
    assert names(dm.named_parameters()) == names(tm.named_parameters())
    assert names(dm.named_buffers()) == names(tm.named_buffers())
    assert names(dm.named_modules()) == names(tm.named_modules())
    assert names(dm.named_children()) == names(tm.named_children())
    assert len(list(dm.parameters())) == len(list(tm.parameters()))
    assert len(list(dm.modules())) == len(list(tm.modules()))
    assert [type(c).__name__ for c in dm.children()] == [type(c).__name__ for c in tm.children()]
    assert names(dm.named_parameters(recurse=False)) == []
    assert names(dm.blocks[0].named_parameters(prefix="x")) == \
        names(tm.blocks[0].named_parameters(prefix="x"))
    shared = dnn.Linear(2, 2)
    seq = dnn.Sequential(shared, shared)
    assert len(list(seq.modules())) == 2 and len(list(seq.parameters())) == 2
    assert dm.get_submodule("blocks.1.0") is dm.blocks[1][0]
    assert dm.get_parameter("blocks.1.0.bias") is dm.blocks[1][0].bias


def test_apply_visits_children_first_like_torch():
    # Property: apply(fn) calls fn on every submodule, children before parents, in torch's order.
    tm, dm = tree(tnn), tree(dnn)
    seen_t, seen_d = [], []
    tm.apply(lambda m: seen_t.append(type(m).__name__))
    assert dm.apply(lambda m: seen_d.append(type(m).__name__)) is dm
    assert seen_d == seen_t


def test_repr_matches_torch():
    # Property: printing a module tree gives torch's text.
    assert repr(tree(dnn)) == repr(tree(tnn))
    assert repr(dnn.LayerNorm(4, elementwise_affine=False)) == \
        repr(tnn.LayerNorm(4, elementwise_affine=False))
    assert repr(dnn.SiLU()) == repr(tnn.SiLU()) and repr(dnn.ReLU()) == repr(tnn.ReLU())
    assert repr(dnn.Embedding(5, 3)) == repr(tnn.Embedding(5, 3))


# ---- state dict ----


def test_state_dict_keys_equal_torch():
    # Property: same keys in the same order as torch (tied weight under both names, persistent
    # buffers included, non-persistent excluded); values are detached views of the module's
    # own memory.
    tm, dm = tree(tnn), tree(dnn)
    sd = dm.state_dict()
    assert list(sd.keys()) == list(tm.state_dict().keys())
    assert "scratch" not in sd and "mask" in sd
    assert "emb.weight" in sd and "head.weight" in sd
    assert not sd["emb.weight"].requires_grad
    assert sd["emb.weight"]._storage_ptr() == dm.emb.weight._storage_ptr()
    assert all(v is dm.emb.weight for k, v in dm.state_dict(keep_vars=True).items()
               if k == "emb.weight")


def test_load_state_dict_copies_values_and_reports_keys():
    # Property: loading copies values into the existing Parameter objects (identity kept,
    # dtype converted); non-strict returns torch's missing/unexpected lists; strict mode and
    # shape mismatches raise naming every offending key.
    torch.manual_seed(1)
    tm, dm = tree(tnn), tree(dnn)
    w = dm.blocks[0][0].weight
    copy_from_torch(dm, tm)
    assert dm.blocks[0][0].weight is w
    np.testing.assert_array_equal(as_np(w), as_np(tm.blocks[0][0].weight))
    np.testing.assert_array_equal(as_np(dm.head.weight), as_np(tm.emb.weight))

    tsd = tm.state_dict()
    bad_t = collections.OrderedDict((k, v) for k, v in tsd.items() if k != "norms.pre.bias")
    bad_t["extra.weight"] = torch.zeros(1)
    bad_d = collections.OrderedDict((k, td.tensor(v.numpy())) for k, v in bad_t.items())
    r_t = tm.load_state_dict(bad_t, strict=False)
    r_d = dm.load_state_dict(bad_d, strict=False)
    assert r_d.missing_keys == r_t.missing_keys == ["norms.pre.bias"]
    assert r_d.unexpected_keys == r_t.unexpected_keys == ["extra.weight"]
    with pytest.raises(RuntimeError) as e:
        dm.load_state_dict(bad_d)
    msg = str(e.value)
    assert 'Missing key(s) in state_dict: "norms.pre.bias"' in msg
    assert 'Unexpected key(s) in state_dict: "extra.weight"' in msg
    bad_shape = {k: td.tensor(v.numpy()) for k, v in tsd.items()}
    bad_shape["blocks.1.0.bias"] = td.zeros(3)
    with pytest.raises(RuntimeError, match=r"size mismatch for blocks\.1\.0\.bias: copying a "
                                           r"param with shape \[3\]"):
        dm.load_state_dict(bad_shape, strict=False)
    half = {k: td.tensor(v.numpy()).bfloat16() for k, v in tsd.items()}
    dm.load_state_dict(half)
    assert dm.blocks[0][0].weight.dtype == td.float32
    np.testing.assert_allclose(as_np(dm.blocks[0][0].weight), as_np(tm.blocks[0][0].weight),
                               rtol=2**-8)


# ---- modes and grads ----


def test_train_eval_propagate_and_change_dropout():
    # Property: train()/eval() set .training on every submodule and return self; Dropout is the
    # identity in eval mode and zeroes about p of the inputs (scaling the rest by 1/(1-p))
    # in training mode.
    dm = tree(dnn)
    assert dm.eval() is dm
    assert all(not m.training for m in dm.modules())
    x = td.ones(4000)
    assert np.array_equal(dm.drop(x).numpy(), x.numpy())
    dm.train()
    assert all(m.training for m in dm.modules())
    y = dm.drop(x).numpy()
    assert set(np.unique(y)) <= {0.0, np.float32(1.0 / 0.75)}
    assert abs((y == 0).mean() - 0.25) < 0.03  # 4000 Bernoulli(0.25): std 0.007
    with pytest.raises(ValueError):
        dm.train("yes")


def test_zero_grad_and_requires_grad():
    # Property: zero_grad() sets grads to None (torch 2's default) or to zeros; requires_grad_
    # toggles every parameter.
    dm = tree(dnn)
    dm(td.tensor([[1, 2, 3]])).sum().backward()
    params = list(dm.parameters())
    assert all(p.grad is not None for p in params)
    dm.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not as_np(p.grad).any() for p in params)
    dm.zero_grad()
    assert all(p.grad is None for p in params)
    dm.requires_grad_(False)
    assert not any(p.requires_grad for p in params)


def test_to_bfloat16_and_back_keeps_parameter_objects():
    # Property: to(bfloat16) converts floating parameters, their grads and floating buffers in
    # place (the Parameter objects, hence optimizers and tying, stay valid); integer buffers
    # stay; .float() converts back; a bf16 forward tracks the fp32 one (bf16 keeps 8 bits:
    # relative 3e-2 after a few layers).
    dm = tree(dnn).eval()  # no dropout: the two forwards must be comparable
    dm.register_buffer("ids", td.arange(3))
    idx = td.tensor([[1, 2, 3, 4]])
    ref = dm(idx)
    ref.sum().backward()
    params = list(dm.parameters())
    assert dm.to(td.bfloat16) is dm
    assert all(a is b for a, b in zip(dm.parameters(), params))
    assert all(p.dtype == td.bfloat16 and p.requires_grad and p.is_leaf for p in params)
    assert all(p.grad.dtype == td.bfloat16 for p in params)
    assert dm.mask.dtype == td.bfloat16 and dm.ids.dtype == td.int64
    assert dm.head.weight is dm.emb.weight
    out = dm(idx)
    assert out.dtype == td.bfloat16
    assert np.linalg.norm(as_np(out) - as_np(ref)) / np.linalg.norm(as_np(ref)) < 3e-2
    dm.float()
    assert all(p.dtype == td.float32 for p in dm.parameters())
    assert dm.to("cpu") is dm and dm.to(device="cpu", dtype=td.float32) is dm
    with pytest.raises(TypeError, match="floating point"):
        dm.to(td.int64)


# ---- layers against torch ----


def check_layer(dmod, tmod, x_np, rtol=1e-5, atol=1e-6, integer=False):
    """Copies torch weights in, compares the forward and every parameter/input gradient."""
    copy_from_torch(dmod, tmod)
    if integer:
        tx, dx = torch.tensor(x_np), td.tensor(x_np)
    else:
        tx = torch.tensor(x_np, requires_grad=True)
        dx = td.tensor(x_np, requires_grad=True)
    ty, dy = tmod(tx), dmod(dx)
    np.testing.assert_allclose(as_np(dy), as_np(ty), rtol=rtol, atol=atol)
    g = np.random.default_rng(9).standard_normal(tuple(ty.shape)).astype(np.float32)
    (ty * torch.tensor(g)).sum().backward()
    (dy * td.tensor(g)).sum().backward()
    if not integer:
        np.testing.assert_allclose(as_np(dx.grad), as_np(tx.grad), rtol=rtol, atol=atol)
    for (n, a), (_, b) in zip(dmod.named_parameters(), tmod.named_parameters()):
        np.testing.assert_allclose(as_np(a.grad), as_np(b.grad), rtol=rtol, atol=atol,
                                   err_msg=n)


def x_of(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    check_layer(dnn.Linear(12, 7, bias=bias), tnn.Linear(12, 7, bias=bias), x_of(3, 5, 12))


def test_embedding():
    ids = np.array([[1, 4, 4, 0], [9, 2, 4, 1]])
    check_layer(dnn.Embedding(10, 6), tnn.Embedding(10, 6), ids, integer=True)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(affine):
    check_layer(dnn.LayerNorm(16, eps=1e-6, elementwise_affine=affine),
                tnn.LayerNorm(16, eps=1e-6, elementwise_affine=affine), x_of(4, 3, 16) * 3 + 1)
    check_layer(dnn.LayerNorm((3, 16)), tnn.LayerNorm((3, 16)), x_of(4, 3, 16))


def test_layer_norm_without_bias():
    # torch 2.1's LayerNorm(bias=False): weight only, compared with torch's functional form.
    m = dnn.LayerNorm(8, bias=False)
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    with td.no_grad():
        m.weight.copy_(td.tensor(x_of(8, seed=1)))
    x = x_of(5, 8)
    ref = torch.nn.functional.layer_norm(torch.tensor(x), (8,), torch.tensor(x_of(8, seed=1)))
    np.testing.assert_allclose(as_np(m(td.tensor(x))), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_rms_norm_against_formula():
    # torch 1.13 has no nn.RMSNorm: compare to x / sqrt(mean(x^2) + eps) * w in float64.
    m = dnn.RMSNorm(8, eps=1e-6)
    w = x_of(8, seed=2)
    with td.no_grad():
        m.weight.copy_(td.tensor(w))
    x = x_of(3, 8).astype(np.float64)
    ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(as_np(m(td.tensor(x.astype(np.float32)))), ref, rtol=1e-5,
                               atol=1e-6)
    assert repr(m) == "RMSNorm((8,), eps=1e-06, elementwise_affine=True)"
    assert dnn.RMSNorm(4, elementwise_affine=False).weight is None


@pytest.mark.parametrize("mods", [
    (dnn.GELU(), tnn.GELU()), (dnn.GELU("tanh"), tnn.GELU("tanh")), (dnn.SiLU(), tnn.SiLU()),
    (dnn.ReLU(), tnn.ReLU()), (dnn.Identity(), tnn.Identity()), (dnn.Tanh(), tnn.Tanh()),
], ids=["gelu", "gelu_tanh", "silu", "relu", "identity", "tanh"])
def test_activations(mods):
    check_layer(mods[0], mods[1], x_of(4, 9) * 2)


def test_sequential_and_containers():
    # Property: Sequential chains and indexes like torch (int, negative, slice keeps names);
    # ModuleList/ModuleDict support the list/dict protocol and register what they hold.
    tseq = tnn.Sequential(tnn.Linear(6, 6), tnn.GELU(), tnn.Linear(6, 2))
    dseq = dnn.Sequential(dnn.Linear(6, 6), dnn.GELU(), dnn.Linear(6, 2))
    check_layer(dseq, tseq, x_of(3, 6))
    assert isinstance(dseq[-1], dnn.Linear) and len(dseq) == 3
    assert list(dseq[1:].state_dict().keys()) == list(tseq[1:].state_dict().keys())
    od = dnn.Sequential(collections.OrderedDict([("a", dnn.ReLU()), ("b", dnn.Identity())]))
    assert [n for n, _ in od.named_children()] == ["a", "b"]

    ml = dnn.ModuleList([dnn.Linear(2, 2)])
    ml.append(dnn.ReLU())
    ml.extend([dnn.Identity(), dnn.Linear(2, 3)])
    ml.insert(1, dnn.SiLU())
    assert [type(m).__name__ for m in ml] == ["Linear", "SiLU", "ReLU", "Identity", "Linear"]
    assert [type(m).__name__ for m in ml[1:3]] == ["SiLU", "ReLU"]
    del ml[1]
    assert list(ml._modules) == ["0", "1", "2", "3"] and isinstance(ml[-1], dnn.Linear)
    assert [n for n, _ in ml.named_parameters()] == ["0.weight", "0.bias", "3.weight", "3.bias"]
    with pytest.raises(IndexError):
        ml[4]

    md = dnn.ModuleDict({"x": dnn.Linear(1, 1)})
    md["y"] = dnn.ReLU()
    assert list(md.keys()) == ["x", "y"] and "y" in md and len(md) == 2
    assert isinstance(md.pop("y"), dnn.ReLU) and list(md) == ["x"]


# ---- initialization ----


def test_default_inits_follow_torch_distributions():
    # Property: Linear weights and biases are U(-1/sqrt(in), 1/sqrt(in)) (torch's kaiming_uniform
    # with a=sqrt(5)); Embedding is N(0, 1); norms start at ones/zeros; the same seed gives the
    # same weights. Sample moments over 64*256 values: std error of the mean ~ 0.008 * sigma.
    td.manual_seed(123)
    lin = dnn.Linear(256, 64)
    bound = 1 / math.sqrt(256)
    w = as_np(lin.weight)
    assert np.abs(w).max() <= bound and np.abs(lin.bias.numpy(force=True)).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.03 * bound  # uniform std = bound/sqrt(3)
    emb = as_np(dnn.Embedding(256, 64).weight)
    assert abs(emb.mean()) < 0.03 and abs(emb.std() - 1) < 0.03
    ln = dnn.LayerNorm(5)
    assert np.all(as_np(ln.weight) == 1) and np.all(as_np(ln.bias) == 0)
    td.manual_seed(123)
    assert np.array_equal(as_np(dnn.Linear(256, 64).weight), w)


def test_init_functions_are_in_place_and_untracked():
    # Property: init functions fill in place (same object, same storage), record no graph and
    # follow their distributions.
    p = dnn.Parameter(td.empty(200, 100))
    ptr = p._storage_ptr()
    assert dnn.init.normal_(p, mean=2.0, std=0.5) is p
    v = as_np(p)
    assert p._storage_ptr() == ptr and p.is_leaf and p.grad_fn is None
    assert abs(v.mean() - 2.0) < 0.01 and abs(v.std() - 0.5) < 0.01
    dnn.init.uniform_(p, -3.0, -1.0)
    v = as_np(p)
    assert v.min() >= -3.0 and v.max() < -1.0 and abs(v.mean() + 2.0) < 0.02
    dnn.init.kaiming_uniform_(p, a=math.sqrt(5))
    assert np.abs(as_np(p)).max() <= 1 / math.sqrt(100)
    dnn.init.zeros_(p)
    assert not as_np(p).any()
    dnn.init.ones_(p)
    assert np.all(as_np(p) == 1)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        dnn.init.kaiming_uniform_(dnn.Parameter(td.zeros(3)))


# ---- subclassing ----


def test_subclass_with_custom_forward_and_kwargs():
    # Property: __call__ forwards positional and keyword arguments; missing forward raises.
    class Scale(dnn.Module):
        def __init__(self):
            super().__init__()
            self.s = dnn.Parameter(td.tensor([2.0]))

        def forward(self, x, shift=0.0):
            return x * self.s + shift

    m = Scale()
    assert m(td.tensor([1.0]), shift=1.0).item() == 3.0
    with pytest.raises(NotImplementedError, match="forward"):
        dnn.Module()(td.zeros(1))
