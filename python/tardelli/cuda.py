"""tardelli.cuda: the CUDA devices, as torch.cuda presents them.

    if td.cuda.is_available():
        x = td.randn(4, 4, device="cuda")
        td.cuda.synchronize()
        print(td.cuda.max_memory_allocated())

Memory figures come from the caching allocator of the device (Note [One allocator for all CUDA
devices] in kernels/runtime/cuda_allocator.cu): allocated = bytes held by live tensors, reserved
= allocated plus blocks cached for reuse.
"""
import contextlib

from . import _C

__all__ = [
    "is_available", "is_built", "device_count", "synchronize", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "reset_peak_memory_stats", "empty_cache",
    "memory_stats", "CUDAGraph", "graph",
]


def is_built() -> bool:
    """True when this tardelli was built with the CUDA backend (GPU present or not)."""
    return _C.cuda_is_built()


def device_count() -> int:
    """The number of visible CUDA devices (0 without the backend, a driver or a GPU)."""
    return _C.cuda_device_count()


def is_available() -> bool:
    return device_count() > 0


def _device(device):
    if device is None:
        return _C.device("cuda")
    if isinstance(device, int):
        return _C.device(f"cuda:{device}")
    d = device if isinstance(device, _C.device) else _C.device(str(device))
    if d.type != "cuda":
        raise ValueError(f"tardelli.cuda: expected a CUDA device, got {d}")
    return d


def synchronize(device=None) -> None:
    """Waits until all work queued on the device (default: the current one) has finished."""
    _C.cuda_synchronize(-1 if device is None else _device(device).index)


def memory_stats(device=None) -> dict:
    return _C.memory_stats(_device(device))


def memory_allocated(device=None) -> int:
    return memory_stats(device)["current_bytes"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["peak_bytes"]


def memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory_stats(_device(device))


def empty_cache(device=None) -> None:
    """Returns the cached, unused blocks of the device's caching allocator to the driver."""
    _C.empty_cache(_device(device))


class CUDAGraph(_C.CudaGraph):
    """A CUDA graph: operations recorded once, replayed with one launch (Note [CUDA graphs] in
    include/tardelli/core/cuda_graph.h). Inputs and outputs are the tensors the capture used:
    copy new data into the inputs before replay(); read the outputs after it.

        g = td.cuda.CUDAGraph()
        with td.cuda.graph(g):
            y = model(x_static)
        x_static.copy_(next_batch); g.replay()   # y holds the new result
    """

    def __init__(self, device=None):
        super().__init__(-1 if device is None else _device(device).index)


@contextlib.contextmanager
def graph(cuda_graph):
    """Captures the operations of the `with` block into `cuda_graph` (as torch.cuda.graph)."""
    cuda_graph.capture_begin()
    try:
        yield cuda_graph
    except BaseException:
        try:
            cuda_graph.capture_end()
        except _C.TardelliError:
            pass  # the block's own error is the one to see
        raise
    cuda_graph.capture_end()
