"""tardelli.nn.utils: gradient clipping (torch.nn.utils' names)."""
import math

from .. import _C
from .._tensor import Tensor
from ..autograd import no_grad

_f32 = _C.dtype.float32


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def _vector_norm(t, norm_type):
    """The p-norm of all elements of t, computed in fp32 (a 0-d float32 tensor)."""
    t = t.detach().float()
    if norm_type == 2.0:
        return _C.norm(t)
    a = _C.abs(t)
    if math.isinf(norm_type):
        if t.numel() == 0:
            return _C.scalar_tensor(0.0, _f32, t.device)
        return a.max() if norm_type > 0 else a.min()
    if norm_type == 1.0:
        return a.sum()
    return (a ** norm_type).sum() ** (1.0 / norm_type)


def get_total_norm(tensors, norm_type=2.0):
    """The p-norm of the per-tensor p-norms (= the norm of all elements together)."""
    norm_type = float(norm_type)
    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return _C.scalar_tensor(0.0, _f32, _C.device("cpu"))
    norms = [_vector_norm(t, norm_type) for t in tensors]
    return _vector_norm(_C.stack(norms, 0), norm_type)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scales all gradients in place by min(1, max_norm / (total_norm + 1e-6)) and returns the
    total norm (before clipping) as a float32 tensor, exactly torch's rule."""
    grads = _grads(parameters)
    max_norm = float(max_norm)
    total = get_total_norm(grads, norm_type)
    if not grads:
        return total
    total_value = total.item()
    if error_if_nonfinite and not math.isfinite(total_value):
        raise RuntimeError(f"The total norm of order {float(norm_type)} for gradients from "
                           "`parameters` is non-finite, so it cannot be clipped. To disable this "
                           "error and scale the gradients by the non-finite norm anyway, set "
                           "`error_if_nonfinite=False`")
    # torch computes the coefficient as a float32 tensor: max_norm / (total + 1e-6), clamped.
    coef = (_C.rdiv(_C.add(total, 1e-6), max_norm)).clamp(None, 1.0).item()
    with no_grad():
        for g in grads:
            g.mul_(coef)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamps every gradient to [-clip_value, clip_value] in place."""
    v = float(clip_value)
    with no_grad():
        for g in _grads(parameters):
            g.copy_(g.clamp(-v, v))


def parameters_to_vector(parameters):
    return _C.cat([p.reshape(-1) for p in parameters], 0)


__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "parameters_to_vector"]
