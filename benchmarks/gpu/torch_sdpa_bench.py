"""torch.nn.functional.scaled_dot_product_attention at the shapes of attention_bench.cpp.

B = 8, T = 2048, H = 16, D = 128 and 64, bf16, causal, on CUDA: forward and forward + backward
timed with CUDA events (3 warm-up runs, median of 10), once with the flash backend forced
(sdpa_kernel(SDPBackend.FLASH_ATTENTION)) and once with torch's default choice. One JSON line per
(shape, backend) in attention_bench's format with "impl": "torch"; {"skipped": reason} without
torch or a GPU.
    python benchmarks/gpu/torch_sdpa_bench.py
"""

import contextlib
import json
import statistics
import sys


def median_ms(fn, torch):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def backends(torch):
    """(name, context factory) pairs: forced flash (when this torch can force it), default."""
    out = []
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        out.append(("flash", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)))
    except ImportError:  # torch < 2.3
        try:
            out.append(
                (
                    "flash",
                    lambda: torch.backends.cuda.sdp_kernel(
                        enable_flash=True, enable_math=False, enable_mem_efficient=False
                    ),
                )
            )
        except AttributeError:
            pass
    out.append(("default", contextlib.nullcontext))
    return out


def main():
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(json.dumps({"bench": "attention", "impl": "torch", "skipped": f"no torch ({e})"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "attention", "impl": "torch", "skipped": "no CUDA device"}))
        return 0
    B, T, H = 8, 2048, 16
    device = torch.device("cuda")
    for D in (128, 64):
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (B, H, T, D)
        q, k, v, g = (
            torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
            for _ in range(4)
        )
        fwd_flop = 4.0 * B * H * T * T * D / 2
        bwd_flop = 2.5 * fwd_flop
        for name, ctx in backends(torch):
            qr, kr, vr = (t.detach().requires_grad_(True) for t in (q, k, v))

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
                torch.autograd.backward(o, g)
                qr.grad = kr.grad = vr.grad = None

            row = {"bench": "attention", "impl": "torch", "backend": name,
                   "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                   "dtype": "bf16", "causal": True, "B": B, "T": T, "H": H, "D": D}
            try:
                with ctx():
                    f_ms = median_ms(fwd, torch)
                    fb_ms = median_ms(fwd_bwd, torch)
            except RuntimeError as e:  # e.g. the flash backend unavailable on this GPU
                row["skipped"] = str(e).splitlines()[0]
                print(json.dumps(row), flush=True)
                continue
            b_ms = fb_ms - f_ms
            row.update({
                "fwd_ms": round(f_ms, 3), "fwd_bwd_ms": round(fb_ms, 3), "bwd_ms": round(b_ms, 3),
                "fwd_tflops": round(fwd_flop / f_ms * 1e-9, 1),
                "bwd_tflops": round(bwd_flop / b_ms * 1e-9, 1),
                "fwd_bwd_tflops": round((fwd_flop + bwd_flop) / fb_ms * 1e-9, 1),
            })
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
