"""tardelli.autograd: grad mode, backward, grad and gradcheck (torch.autograd's names)."""
import functools

from . import _C
from ._tensor import Tensor, TardelliError

Node = _C.Node


class GradcheckError(TardelliError):
    """gradcheck found an analytic gradient that disagrees with finite differences."""


def is_grad_enabled():
    return _C.is_grad_enabled()


class _GradMode:
    """Context manager and decorator that sets grad mode and restores it on exit."""

    mode = None

    def __enter__(self):
        self._prev = _C.is_grad_enabled()
        _C.set_grad_enabled(self.mode)
        return self

    def __exit__(self, *exc):
        _C.set_grad_enabled(self._prev)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):
    """Ops inside do not record autograd history."""
    mode = False


class enable_grad(_GradMode):
    """Re-enables recording inside a no_grad region."""
    mode = True


inference_mode = no_grad


class set_grad_enabled:
    """Sets grad mode now; used as a context manager it restores the previous mode on exit."""

    def __init__(self, mode):
        self._prev = _C.is_grad_enabled()
        _C.set_grad_enabled(bool(mode))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _C.set_grad_enabled(self._prev)
        return False


def _tensors(x):
    if x is None:
        return None
    if isinstance(x, Tensor):
        return [x]
    return list(x)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False):
    """Accumulates gradients of `tensors` into the .grad of the leaves they depend on."""
    roots = _tensors(tensors)
    grads = _tensors(grad_tensors) or [None] * len(roots)
    if retain_graph is None:
        retain_graph = create_graph
    _C.backward(roots, grads, retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False):
    """Gradients of `outputs` w.r.t. `inputs` (a tuple), without touching any .grad."""
    roots = _tensors(outputs)
    xs = _tensors(inputs)
    grads = _tensors(grad_outputs) or [None] * len(roots)
    if retain_graph is None:
        retain_graph = create_graph
    return tuple(_C.grad(roots, xs, grads, retain_graph, create_graph, allow_unused))


def gradcheck(fn, inputs, eps=1e-3, atol=1e-3, rtol=1e-2, raise_exception=True, seed=0):
    """Compares the gradients of fn(*inputs) with central differences.

    Inputs that require grad must be float32 leaves (finite differences in fp32, hence the
    looser defaults than torch's float64 ones). Returns True, or raises GradcheckError (or
    returns False with raise_exception=False).
    """
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)

    def f(xs):
        out = fn(*xs)
        if isinstance(out, Tensor):
            return out
        return _C.cat([o.reshape(-1) for o in out], 0)

    ok, max_err, message = _C.gradcheck(f, list(inputs), eps, atol, rtol, seed)
    if not ok and raise_exception:
        raise GradcheckError(f"{message} (max abs error {max_err:.3g})")
    return ok


__all__ = ["Node", "GradcheckError", "is_grad_enabled", "no_grad", "enable_grad",
           "inference_mode", "set_grad_enabled", "backward", "grad", "gradcheck"]
