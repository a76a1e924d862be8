"""tardelli.backends: switches of the compute backends, named as in torch.backends.

    td.backends.cuda.matmul.allow_tf32 = True   # fp32 GEMMs may use TF32 tensor cores
"""
from . import _C

__all__ = ["cuda"]


class _CudaMatmul:
    """`allow_tf32`: fp32 matrix products on CUDA may round their inputs to TF32 (10-bit
    mantissa) for tensor-core speed. Off by default, as in torch. No effect on the CPU."""

    @property
    def allow_tf32(self) -> bool:
        return _C.matmul_allow_tf32()

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        _C.set_matmul_allow_tf32(bool(value))


class _Cuda:
    matmul = _CudaMatmul()

    @staticmethod
    def is_built() -> bool:
        return _C.cuda_is_built()


cuda = _Cuda()
