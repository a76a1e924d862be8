"""Autograd collectives (Megatron's tensor-parallel mappings); the backward of each is its dual.

    copy_to_region             fwd identity               bwd all_reduce
    reduce_from_region         fwd all_reduce             bwd identity
    scatter_to_region          fwd keep own chunk (dim)   bwd all_gather (dim)
    gather_from_region         fwd all_gather (dim)       bwd keep own chunk (dim)
    reduce_scatter_to_sequence fwd reduce_scatter (dim)   bwd all_gather (dim)
    gather_from_sequence       fwd all_gather (dim)       bwd reduce_scatter (dim), or keep own
                                                          chunk when tp_output_grad=False

`group` defaults to the world (td.distributed.init()). Every rank of the group must make the
same calls in the same order (see include/tardelli/distributed/collectives.h).
"""
from .. import _C

_D = _C.distributed


def _g(group):
    if group is not None:
        return group
    from . import world
    return world()


def copy_to_region(input, group=None):  # noqa: A002
    return _D.copy_to_region(input, _g(group))


def reduce_from_region(input, group=None):  # noqa: A002
    return _D.reduce_from_region(input, _g(group))


def scatter_to_region(input, group=None, dim=-1):  # noqa: A002
    return _D.scatter_to_region(input, _g(group), dim)


def gather_from_region(input, group=None, dim=-1):  # noqa: A002
    return _D.gather_from_region(input, _g(group), dim)


def reduce_scatter_to_sequence(input, group=None, dim=0):  # noqa: A002
    return _D.reduce_scatter_to_sequence(input, _g(group), dim)


def gather_from_sequence(input, group=None, dim=0, tp_output_grad=True):  # noqa: A002
    return _D.gather_from_sequence(input, _g(group), dim, tp_output_grad)


__all__ = ["copy_to_region", "gather_from_region", "gather_from_sequence", "reduce_from_region",
           "reduce_scatter_to_sequence", "scatter_to_region"]
