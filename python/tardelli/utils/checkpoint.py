"""Activation checkpointing, torch.utils.checkpoint's interface over the C++ facility
(include/tardelli/autograd/checkpoint.h, Note [Checkpoint]).

    from tardelli.utils.checkpoint import checkpoint
    y = checkpoint(block, x)          # keeps x only; block runs again in backward

The function runs once under no-grad; in backward it runs again with grad on (from the saved
inputs, with the random streams replayed), and its graph is backpropagated: parameters used
inside get their .grad (and post-accumulate hooks) as usual, and the gradients are bitwise the
ones of calling the function directly.
"""
from .. import _C
from .._tensor import Tensor

__all__ = ["checkpoint"]


def checkpoint(function, *args, generators=None, preserve_rng_state=True, use_reentrant=None,
               **kwargs):
    """function(*args, **kwargs) with only its tensor arguments kept for backward.

    generators: the td.Generator streams the function draws from, replayed in the
    recomputation; by default td.default_generator (what dropout uses without a generator)
    when preserve_rng_state. The function must be deterministic given its inputs and those
    streams, must not modify its inputs, and may return a tensor or a tuple/list of tensors.
    Tensors it uses besides its arguments must be leaves (parameters) or not require grad.
    use_reentrant is accepted for torch compatibility; this is the reentrant form either way.
    """
    del use_reentrant
    if generators is None:
        generators = [_C.default_generator()] if preserve_rng_state else []
    generators = list(generators)
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    shape = {}

    def run(tensors):
        _ = generators  # keeps the streams alive as long as the recorded node
        full = list(args)
        for i, t in zip(positions, tensors):
            full[i] = t
        out = function(*full, **kwargs)
        single = isinstance(out, Tensor)
        outs = [out] if single else list(out)
        shape.setdefault("single", single)
        shape.setdefault("tuple", isinstance(out, tuple))
        return outs

    outs = _C.autograd_checkpoint(run, [args[i] for i in positions], generators)
    if shape["single"]:
        return outs[0]
    return tuple(outs) if shape["tuple"] else list(outs)
