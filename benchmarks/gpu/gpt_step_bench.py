#!/usr/bin/env python3
"""One training step of the fused GPT on a GPU against the same model in eager PyTorch.

    PYTHONPATH=python python benchmarks/gpu/gpt_step_bench.py                 # GPT-2 small, bf16
    PYTHONPATH=python python benchmarks/gpu/gpt_step_bench.py --dtype fp32 --layers 4

A step is forward (mean cross-entropy) + backward + AdamW step + zero_grad. It is timed with the
host clock around synchronized steps, after --warmup untimed ones, and reported as the median of
--steps. Both sides start from the same weights (td's GPT-2 initialization, copied into torch)
and see the same tokens. The torch model is the same math written the usual way for speed on a
GPU: F.scaled_dot_product_attention(is_causal=True) (torch picks its fastest backend), the tied
LM head, autocast to bf16 over fp32 master weights for --dtype bf16 (td: GPTConfig dtype bf16,
also fp32 masters), fused AdamW, eager mode (no torch.compile). GPT-2 only.

Output: JSON lines, one per framework, then a summary line with tokens_per_s, step_ms, mfu
(model FLOPs, td.models.GPT.flops_per_step, over the dense bf16 / plain fp32 peak of an H100/H200
SXM from the datasheet, 989 / 67 TFLOP/s; TF32 stays off, the default on both sides), peak
memory and the ratio td / torch. Without a GPU it prints {"skipped": ...} and exits 0.
"""
import argparse
import json
import statistics
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=50304)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--fp8", choices=["none", "hybrid", "e4m3"], default="none",
                   help="td's blocks' linears in FP8 (delayed scaling, 16 steps of amax history; "
                        "cuBLASLt FP8 GEMMs); the torch side stays in --dtype")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--breakdown", action="store_true",
                   help="also time forward, backward and optimizer step separately (synchronized)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="td's whole step (forward, backward, AdamW with capturable=True) "
                        "captured once in a CUDA graph (Note [CUDA graphs]) and replayed")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also print td's N most expensive GPU kernels and CUDA runtime calls per "
                        "step (torch.profiler over 3 steps: CUPTI records every kernel of the "
                        "process, td's included)")
    return p.parse_args()


def median_step(step, sync, steps, warmup):
    for _ in range(warmup):
        step()
    sync()
    times, loss = [], None
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), loss


def train_step(fwd, opt_step):
    loss = fwd()
    loss.backward()
    opt_step()
    return loss


def phases(fwd, bwd, opt_step, sync, steps):
    """Median milliseconds of forward, backward and optimizer step, each synchronized."""
    out = {"forward_ms": [], "backward_ms": [], "optimizer_ms": []}
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        loss = fwd()
        sync()
        t1 = time.perf_counter()
        bwd(loss)
        sync()
        t2 = time.perf_counter()
        opt_step()
        sync()
        t3 = time.perf_counter()
        out["forward_ms"].append((t1 - t0) * 1e3)
        out["backward_ms"].append((t2 - t1) * 1e3)
        out["optimizer_ms"].append((t3 - t2) * 1e3)
    return {k: statistics.median(v) for k, v in out.items()}


def kernel_profile(step, sync, top, steps=3):
    """td's step under torch.profiler: the `top` GPU kernels by device time and the `top` CUDA
    runtime calls by count (host synchronizations show as cudaMemcpy / cudaStreamSynchronize /
    cudaEventSynchronize), each per step. CUPTI traces every kernel of the process, so td's
    kernels appear although torch launched none of them. Empty (with a note) without torch."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        return [{"bench": "gpt_step_profile", "skipped": str(e)}]
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync()
    kernels, runtime = {}, {}
    for e in prof.events():
        kind = str(getattr(e, "device_type", ""))
        dev_us = e.time_range.elapsed_us() if kind.endswith("CUDA") else 0.0
        if dev_us:
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += dev_us
        elif e.name.startswith("cuda") or e.name.startswith("cu"):
            r = runtime.setdefault(e.name, [0, 0.0])
            r[0] += 1
            r[1] += getattr(e, "cpu_time", 0.0) or 0.0
    total = sum(v[1] for v in kernels.values())
    out = [{"bench": "gpt_step_profile", "gpu_kernel_ms_per_step": total / 1e3 / steps,
            "kernels": len(kernels),
            "launches_per_step": sum(v[0] for v in kernels.values()) / steps}]
    for name, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append({"bench": "gpt_step_profile", "kernel": name[:120], "calls_per_step": n / steps,
                    "ms_per_step": us / 1e3 / steps, "share": us / total if total else 0.0})
    for name, (n, us) in sorted(runtime.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append({"bench": "gpt_step_profile", "runtime_call": name, "calls_per_step": n / steps,
                    "host_ms_per_step": us / 1e3 / steps})
    return out


def main():
    a = parse_args()
    import numpy as np
    import tardelli as td
    if not td.cuda.is_available():
        print(json.dumps({"bench": "gpt_step", "skipped": "no CUDA device"}))
        return 0
    B, T, V = a.micro_batch_size, a.seq_len, a.vocab_size
    cfg = td.models.GPTConfig(arch="gpt2", vocab_size=V, block_size=T, n_layer=a.layers,
                              n_head=a.heads, d_model=a.d_model, dtype=a.dtype, seed=1)
    model = td.models.GPT(cfg)
    init = {n: np.array(p.detach().numpy(), copy=True) for n, p in model.named_parameters()}
    if a.fp8 != "none":
        model.set_fp8(history=16, margin=0.0, recipe=a.fp8)
    model = model.to("cuda")
    rng = np.random.default_rng(0)
    x_np = rng.integers(0, V, (B, T), dtype=np.int64)
    y_np = rng.integers(0, V, (B, T), dtype=np.int64)
    flops = model.flops_per_step(B, T)
    peak = 989e12 if a.dtype == "bf16" else 67e12
    tokens = B * T
    rows = []

    x, y = td.from_numpy(x_np).to("cuda"), td.from_numpy(y_np).to("cuda")
    opt = td.optim.AdamW(model.param_groups(weight_decay=0.1), lr=3e-4, betas=(0.9, 0.95),
                         capturable=a.cuda_graph)

    def td_fwd():
        return model(x, y)

    def td_opt():
        opt.step()
        # Gradients zeroed in place, not dropped: a captured backward accumulates into them.
        opt.zero_grad(set_to_none=not a.cuda_graph)
        if a.fp8 != "none":
            model.commit_fp8()  # the step's amaxes into the histories, as the trainer does

    step = lambda: train_step(td_fwd, td_opt)  # noqa: E731
    graph_note = None
    if a.cuda_graph:
        if a.fp8 != "none":
            raise SystemExit("--cuda-graph with --fp8: the FP8 scales are host values (not "
                             "capturable yet)")
        for _ in range(a.warmup):  # eager steps first: plans, workspaces, the gradients
            step()
        td.cuda.synchronize()
        g = td.cuda.CUDAGraph()
        try:
            with td.cuda.graph(g):
                static_loss = train_step(td_fwd, td_opt)

            def step():
                g.replay()
                return static_loss
        except td.TardelliError as e:  # a host wait left in the step: report it, run eagerly
            graph_note = str(e)[:300]
            print(json.dumps({"bench": "gpt_step", "framework": "tardelli",
                              "cuda_graph_failed": graph_note}), flush=True)

    td.cuda.reset_peak_memory_stats()
    dt, loss = median_step(step, td.cuda.synchronize, a.steps, a.warmup)
    rows.append({"bench": "gpt_step", "framework": "tardelli", "dtype": a.dtype, "fp8": a.fp8,
                 "cuda_graph": a.cuda_graph and graph_note is None,
                 "step_ms": dt * 1e3, "tokens_per_s": tokens / dt, "mfu": flops / dt / peak,
                 "peak_mem_bytes": td.cuda.max_memory_allocated(), "loss": loss.item()})
    if a.breakdown:
        rows[-1].update(phases(td_fwd, lambda l: l.backward(), td_opt, td.cuda.synchronize,
                               a.steps))
    print(json.dumps(rows[-1]), flush=True)
    if a.profile:
        for r in kernel_profile(lambda: train_step(td_fwd, td_opt), td.cuda.synchronize,
                                a.profile):
            print(json.dumps(r), flush=True)
    del model, opt, x, y, loss, td_fwd, td_opt
    td.cuda.empty_cache()

    if not a.no_torch:
        try:
            rows.append(torch_row(a, init, x_np, y_np, flops, peak, tokens))
            print(json.dumps(rows[-1]), flush=True)
        except ImportError as e:
            print(json.dumps({"bench": "gpt_step", "framework": "torch", "skipped": str(e)}))
    s = {"bench": "gpt_step", "summary": True, "config": vars(a), "flops_per_step": flops,
         "peak_flops_assumed": peak, **{f"td_{k}": v for k, v in rows[0].items()
                                        if k in ("step_ms", "tokens_per_s", "mfu",
                                                 "peak_mem_bytes")}}
    if len(rows) > 1:
        s["torch_tokens_per_s"] = rows[1]["tokens_per_s"]
        s["torch_mfu"] = rows[1]["mfu"]
        s["torch_peak_mem_bytes"] = rows[1]["peak_mem_bytes"]
        s["speedup_vs_torch"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
        s["mem_ratio_vs_torch"] = rows[0]["peak_mem_bytes"] / rows[1]["peak_mem_bytes"]
    print(json.dumps(s), flush=True)
    return 0


def torch_row(a, init, x_np, y_np, flops, peak, tokens):
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda")
    p = {n: torch.tensor(v, device=dev, requires_grad=True) for n, v in init.items()}
    H, d = a.heads, a.d_model
    eps = 1e-5

    def forward(idx, tgt):
        Bq, Tq = idx.shape
        h = p["wte.weight"][idx] + p["wpe.weight"][:Tq]
        for i in range(a.layers):
            q = f"h.{i}."
            n1 = F.layer_norm(h, (d,), p[q + "ln_1.weight"], p[q + "ln_1.bias"], eps)
            qkv = F.linear(n1, p[q + "attn.c_attn.weight"], p[q + "attn.c_attn.bias"])
            qq, kk, vv = (t.view(Bq, Tq, H, d // H).transpose(1, 2) for t in qkv.split(d, -1))
            att = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            att = att.transpose(1, 2).reshape(Bq, Tq, d)
            h = h + F.linear(att, p[q + "attn.c_proj.weight"], p[q + "attn.c_proj.bias"])
            n2 = F.layer_norm(h, (d,), p[q + "ln_2.weight"], p[q + "ln_2.bias"], eps)
            m = F.gelu(F.linear(n2, p[q + "mlp.c_fc.weight"], p[q + "mlp.c_fc.bias"]),
                       approximate="tanh")
            h = h + F.linear(m, p[q + "mlp.c_proj.weight"], p[q + "mlp.c_proj.bias"])
        h = F.layer_norm(h, (d,), p["ln_f.weight"], p["ln_f.bias"], eps)
        logits = F.linear(h, p["wte.weight"])
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), tgt.view(-1))

    groups = [{"params": [t for t in p.values() if t.dim() >= 2], "weight_decay": 0.1},
              {"params": [t for t in p.values() if t.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), fused=True)
    x = torch.tensor(x_np, device=dev)
    y = torch.tensor(y_np, device=dev)
    use_bf16 = a.dtype == "bf16"
    # fp32: TF32 stays off on both sides (the default of td and of torch's matmuls).

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            return forward(x, y)

    def opt_step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    dt, loss = median_step(lambda: train_step(fwd, opt_step), torch.cuda.synchronize, a.steps,
                           a.warmup)
    row = {"bench": "gpt_step", "framework": "torch", "torch": torch.__version__,
           "dtype": a.dtype, "step_ms": dt * 1e3, "tokens_per_s": tokens / dt,
           "mfu": flops / dt / peak, "peak_mem_bytes": torch.cuda.max_memory_allocated(),
           "loss": loss.item()}
    if a.breakdown:
        row.update(phases(fwd, lambda l: l.backward(), opt_step, torch.cuda.synchronize,
                          a.steps))
    return row


if __name__ == "__main__":
    raise SystemExit(main())
