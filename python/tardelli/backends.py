"""tardelli.backends: switches of the compute backends, named as in torch.backends.

    td.backends.cuda.matmul.allow_tf32 = True   # fp32 GEMMs may use TF32 tensor cores
    td.backends.cpu.matmul_kernel(td.bfloat16)   # e.g. 'brg:avx512_core_amx' on an AMX CPU
"""
from . import _C
from ._tensor import as_dtype

__all__ = ["cpu", "cuda"]


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


class _Cpu:
    """What the CPU backend runs on this machine (read-only)."""

    @staticmethod
    def isa() -> str:
        """The instruction set oneDNN's kernels target: 'avx2', 'avx512_core_bf16',
        'avx512_core_amx', ... (the CPU's, capped by ONEDNN_MAX_CPU_ISA and the OS)."""
        return _C.cpu_isa()

    @staticmethod
    def matmul_kernel(dtype) -> str:
        """oneDNN's name for the kernel CPU matrix products of `dtype` run ('gemm:jit',
        'brg:avx512_core_amx', ...), or 'fp32 widening (...)' where oneDNN has none for the
        dtype on this CPU and products are computed in fp32 from converted operands."""
        return _C.cpu_matmul_kernel(as_dtype(dtype))


cpu = _Cpu()
