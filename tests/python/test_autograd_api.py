"""The Python autograd API against PyTorch: backward, accumulation, retain_graph, no_grad,
hooks, retain_grad, autograd.grad, create_graph and gradcheck.

Gradients are compared with rtol 1e-5: both libraries evaluate the same float32 formulas,
possibly summing in another order (a few ulps).
"""
import numpy as np
import pytest
import torch

import tardelli as td

F = td.nn.functional


def leaves(shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return td.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a.detach()), b.detach().numpy(), rtol=rtol, atol=atol)


def model(lib, x, w):
    h = lib.nn.functional.gelu(x @ w)
    return (lib.softmax(h, -1) * h).sum() + (h ** 2).mean()


def test_backward_matches_torch():
    # Property: the gradients of a small composite function equal torch's.
    x, tx = leaves((3, 4), 1)
    w, tw = leaves((4, 5), 2)
    loss, tloss = model(td, x, w), model(torch, tx, tw)
    close(loss, tloss)
    loss.backward()
    tloss.backward()
    close(x.grad, tx.grad)
    close(w.grad, tw.grad)
    assert x.is_leaf and not loss.is_leaf
    assert loss.grad_fn is not None and loss.grad_fn.name() == "AddBackward"
    assert x.grad_fn is None and x.grad.grad_fn is None


def test_backward_with_gradient_argument():
    x, tx = leaves((2, 3), 3)
    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    (x * x).backward(td.tensor(g))
    (tx * tx).backward(torch.tensor(g))
    close(x.grad, tx.grad)
    (x * 3).backward(gradient=td.ones(2, 3))
    (tx * 3).backward(gradient=torch.ones(2, 3))
    close(x.grad, tx.grad)


def test_grad_accumulates_across_backward_calls():
    # Property: a second backward adds into .grad (it does not overwrite); setting grad to None
    # starts over; grad is settable.
    x, _ = leaves((4,), 4)
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(4, 5.0, np.float32))
    x.grad = None
    assert x.grad is None
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(4, 3.0, np.float32))
    x.grad = td.zeros(4)
    (x * 1).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.ones(4, np.float32))


def test_retain_graph_allows_second_backward():
    # Property: with retain_graph=True the graph can be run again, and the two gradients add.
    x, tx = leaves((3,), 5)
    y, ty = (x.exp() * x).sum(), (tx.exp() * tx).sum()
    y.backward(retain_graph=True)
    y.backward()
    ty.backward(retain_graph=True)
    ty.backward()
    close(x.grad, tx.grad)


def test_no_grad_enable_grad_set_grad_enabled():
    # Property: no_grad stops recording (as a context manager and a decorator), enable_grad turns
    # it back on inside, set_grad_enabled works as a call and as a context manager.
    x = td.ones(2, requires_grad=True)
    with td.no_grad():
        y = x * 2
        assert not td.is_grad_enabled()
        with td.enable_grad():
            z = x * 2
    assert td.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and z.grad_fn is not None

    @td.no_grad()
    def f(a):
        return a * 3

    assert not f(x).requires_grad and td.is_grad_enabled()
    with td.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert td.is_grad_enabled()
    td.set_grad_enabled(False)
    try:
        assert not (x + 1).requires_grad
    finally:
        td.set_grad_enabled(True)
    with td.autograd.no_grad():
        x.add_(td.ones(2))  # allowed: not recorded
    assert x.tolist() == [2.0, 2.0]


def test_hooks_see_and_replace_gradients():
    # Property: a hook receives the gradient w.r.t. its tensor; returning a tensor replaces it
    # (downstream gradients change accordingly); returning None keeps it.
    x, tx = leaves((3,), 6)
    seen = []
    h = x * 2
    h.register_hook(lambda g: seen.append(g.numpy().copy()))
    h.register_hook(lambda g: g * 10)
    (h * td.tensor([1.0, 2.0, 3.0])).sum().backward()
    np.testing.assert_array_equal(seen[0], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(x.grad.numpy(), [20.0, 40.0, 60.0])

    th = tx * 2
    th.register_hook(lambda g: g * 10)
    (th * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    close(x.grad, tx.grad)

    leaf_seen = []
    y, _ = leaves((2,), 7)
    y.register_hook(lambda g: leaf_seen.append(g.tolist()) or g + 1)
    (y * 3).sum().backward()
    assert leaf_seen == [[3.0, 3.0]]
    assert y.grad.tolist() == [4.0, 4.0]


def test_hook_exception_propagates():
    x, _ = leaves((2,), 8)

    def bad(g):
        raise KeyError("from hook")

    y = x * 2
    y.register_hook(bad)
    with pytest.raises(KeyError, match="from hook"):
        y.sum().backward()


def test_post_accumulate_grad_hook_and_retain_grad():
    x, tx = leaves((3,), 9)
    calls = []
    x.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.tolist()))
    h = x * x
    h.retain_grad()
    th = tx * tx
    th.retain_grad()
    assert h.retains_grad
    h.sum().backward()
    th.sum().backward()
    close(h.grad, th.grad)
    close(x.grad, tx.grad)
    assert calls == [x.grad.tolist()]
    assert (x * 2).grad is None  # non-leaf without retain_grad


def test_autograd_grad_does_not_touch_dot_grad():
    x, tx = leaves((3,), 10)
    w, tw = leaves((3,), 11)
    (gx, gw) = td.autograd.grad((x * w).sum(), (x, w))
    tgx, tgw = torch.autograd.grad((tx * tw).sum(), (tx, tw))
    close(gx, tgx)
    close(gw, tgw)
    assert x.grad is None and w.grad is None
    unused, _ = leaves((2,), 12)
    r = td.autograd.grad((x * 2).sum(), [x, unused], allow_unused=True)
    assert r[1] is None and r[0].tolist() == [2.0, 2.0, 2.0]


def test_create_graph_gives_second_derivatives():
    # Property: with create_graph the gradient is itself differentiable: d2(x^3)/dx2 = 6x.
    x, tx = leaves((4,), 13)
    (g,) = td.autograd.grad((x ** 3).sum(), x, create_graph=True)
    (tg,) = torch.autograd.grad((tx ** 3).sum(), tx, create_graph=True)
    close(g, tg)
    assert g.requires_grad
    g.sum().backward()
    tg.sum().backward()
    close(x.grad, tx.grad, rtol=1e-5)


def test_requires_grad_property_and_detach():
    x = td.ones(3)
    assert not x.requires_grad
    assert x.requires_grad_() is x and x.requires_grad
    x.requires_grad = False
    assert not x.requires_grad
    y = td.ones(2, requires_grad=True)
    d = y.detach()
    assert not d.requires_grad and d.is_leaf
    z = y * 2
    z.data = td.zeros(2)
    assert z.tolist() == [0.0, 0.0] and z.grad_fn is not None


def test_gradcheck_accepts_correct_and_rejects_wrong_gradients():
    # Property: gradcheck passes a correct op and catches a wrong gradient (a hook that triples
    # it), naming the failing input.
    x, _ = leaves((2, 3), 14)
    w, _ = leaves((3, 2), 15)
    assert td.autograd.gradcheck(lambda a, b: F.gelu(a @ b), (x, w))

    def wrong(a):
        y = a * 2
        if y.requires_grad:  # the finite-difference evaluations run under no_grad
            y.register_hook(lambda g: g * 3)
        return y

    with pytest.raises(td.autograd.GradcheckError, match="input 0"):
        td.autograd.gradcheck(wrong, (x,))
    assert td.autograd.gradcheck(wrong, x, raise_exception=False) is False
    assert td.autograd.gradcheck(lambda a: (a.sum(0), a.exp()), (x,))
