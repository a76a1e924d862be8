"""tardelli.nn.Parameter: a tensor that a Module registers as a parameter (torch.nn.Parameter)."""
from .. import _C
from .._tensor import Tensor


class Parameter(Tensor):
    """A leaf tensor that requires grad (by default) and that Module.__setattr__ registers.

    Note [Parameter shares the TensorImpl]: Parameter(t) is a new Python handle to the SAME C++
    tensor as `t` (not a copy, not a detached alias), so a parameter handed out by a C++ module
    (td.models) and the Python object see one storage, one .grad and one requires_grad flag.
    A non-leaf `t` (one with a grad_fn) is detached first, as a parameter must be a leaf.
    Results of ops on a Parameter are plain Tensors, as in torch.
    """

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = _C.empty([0], _C.dtype.float32, _C.device("cpu"), False)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: expected a tardelli Tensor, got {type(data).__name__}")
        if data.grad_fn is not None:
            data = data.detach()
        super().__init__(data)
        self.requires_grad_(requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + Tensor.__repr__(self)

    __str__ = __repr__


__all__ = ["Parameter"]
