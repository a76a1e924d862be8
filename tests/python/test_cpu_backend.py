"""td.backends.cpu: which instruction set and matmul kernels the CPU backend uses here."""
import pytest

import tardelli as td


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_matmul_kernels_are_reported():
    """fp32 products always have a native oneDNN kernel; bf16/f16 have one or are widened."""
    f32 = td.backends.cpu.matmul_kernel(td.float32)
    assert f32 and not f32.startswith("ref") and "widening" not in f32
    for dt in (td.bfloat16, "float16"):
        k = td.backends.cpu.matmul_kernel(dt)
        assert k.startswith("fp32 widening (oneDNN: ") or not k.startswith("ref"), k
    assert td.backends.cpu.isa()
    with pytest.raises(td.TardelliError, match="floating"):
        td.backends.cpu.matmul_kernel(td.int64)


def test_bf16_matmul_uses_amx_where_the_cpu_has_it():
    """On a CPU with AMX, bf16 products (the bf16 training path) must run on AMX."""
    kernel = td.backends.cpu.matmul_kernel(td.bfloat16)
    if "amx_bf16" not in _cpu_flags():
        pytest.skip(f"this CPU has no AMX (oneDNN ISA {td.backends.cpu.isa()}); "
                    f"bf16 products run as {kernel}")
    assert td.backends.cpu.isa() == "avx512_core_amx"
    assert "amx" in kernel, kernel
