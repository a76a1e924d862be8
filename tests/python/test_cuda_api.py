"""td.cuda and td.backends without a GPU (what CI can check), and with one (the GPU machine)."""
import pytest

import tardelli as td

HAS_GPU = td.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA device (runs on the GPU machine)")


def test_device_count_is_consistent():
    """is_available() is device_count() > 0; without the backend there are no devices."""
    n = td.cuda.device_count()
    assert n >= 0
    assert td.cuda.is_available() == (n > 0)
    if not td.cuda.is_built():
        assert n == 0


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_moving_to_cuda_without_a_gpu_is_a_clear_error():
    """x.to('cuda') without a usable GPU names the device and the reason, never crashes."""
    x = td.ones(3)
    with pytest.raises(td.TardelliError, match="cuda"):
        x.to("cuda")
    with pytest.raises(td.TardelliError, match="cuda"):
        td.zeros(2, 2, device="cuda")
    with pytest.raises(td.TardelliError):
        td.cuda.synchronize()


def test_tf32_switch_round_trips():
    """backends.cuda.matmul.allow_tf32 is off by default (as in torch) and settable."""
    assert td.backends.cuda.matmul.allow_tf32 is False
    td.backends.cuda.matmul.allow_tf32 = True
    try:
        assert td.backends.cuda.matmul.allow_tf32 is True
    finally:
        td.backends.cuda.matmul.allow_tf32 = False


@needs_gpu
def test_round_trip_and_memory_stats():
    """CPU -> CUDA -> CPU is bitwise for every dtype; allocated bytes rise with a live tensor and
    the peak is at least the current value."""
    td.cuda.synchronize()
    before = td.cuda.memory_allocated()
    for dt in (td.float32, td.bfloat16, td.float16, td.int32, td.int64):
        x = td.arange(0, 1000, dtype=dt)
        y = x.to("cuda")
        assert y.device.type == "cuda" and y.dtype == dt
        assert td.equal(y.cpu(), x) if hasattr(td, "equal") else bool((y.cpu() == x).all())
    big = td.empty(1 << 20, device="cuda")
    assert td.cuda.memory_allocated() >= before + 4 * (1 << 20)
    assert td.cuda.max_memory_allocated() >= td.cuda.memory_allocated()
    del big
    td.cuda.empty_cache()


@needs_gpu
def test_autograd_across_devices():
    """The gradient of a .to('cuda') flows back to the CPU leaf."""
    x = td.randn(4, 5, requires_grad=True)
    y = (x.to("cuda") * 3.0).sum()
    y.backward()
    assert x.grad.device.type == "cpu"
    assert bool((x.grad == 3.0).all())


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_cuda_graph_without_a_gpu_is_a_clear_error():
    """td.cuda.CUDAGraph needs a CUDA device: a TardelliError says so."""
    with pytest.raises(td.TardelliError, match="CUDA"):
        td.cuda.CUDAGraph()


@needs_gpu
def test_cuda_graph_replays_what_it_captured():
    """Note [CUDA graphs]: ops captured inside `with td.cuda.graph(g)` run again on g.replay()
    against the static input's new contents, equal to the eager result (same kernels: bitwise);
    a host read inside the block is an error, raised by the block or at its end."""
    w = td.randn(32, 16, device="cuda")
    x = td.randn(8, 16, device="cuda")
    f = (lambda t: td.nn.functional.gelu(t @ w.t()))
    f(x)  # warm-up
    g = td.cuda.CUDAGraph()
    with td.cuda.graph(g):
        y = f(x)
    assert g.ready
    for _ in range(2):
        fresh = td.randn(8, 16, device="cuda")
        x.copy_(fresh)
        g.replay()
        assert bool((y.cpu() == f(fresh).cpu()).all())
    with pytest.raises(td.TardelliError):
        with td.cuda.graph(td.cuda.CUDAGraph()):
            (x * 2).sum().item()
