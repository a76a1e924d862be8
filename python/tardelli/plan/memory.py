"""Per-rank peak memory of one training step under a layout, from the formulas of
docs/planner.md ("Memory"): model states per ZeRO stage, activations per schedule and
recomputation mode, the LM head's and a block backward's working set, communication buffers,
and the allocator's rounding (its size classes).

Every figure is in bytes as the allocator counts them: each tensor rounded to its size class
(src/core/allocator.cpp, Note [CPU caching allocator]) on the CPU, to 512 bytes on a GPU."""
import math

from .layout import stage_layers

# src/core/allocator.cpp: blocks >= 256 KiB round up to eighths of a power of two.
_CACHE_MIN = 256 << 10
# include/tardelli/ops/loss.h: logits per chunk of the LM head on the CPU and on a GPU.
HEAD_CHUNK = {"td_cpu": 1 << 22, "cuda_caching": 1 << 27}


def size_class(nbytes, allocator="td_cpu"):
    """The bytes the allocator charges for a request of `nbytes`."""
    n = max(int(nbytes), 1)
    if allocator == "cuda_caching":
        return (n + 511) // 512 * 512
    if n < _CACHE_MIN:
        return (n + 63) // 64 * 64
    step = (1 << (n.bit_length() - 1)) // 8
    return (n + step - 1) // step * step


def block_activation_tensors(spec, layout, tokens, mode):
    """Byte sizes of the tensors one transformer block keeps for backward for `tokens` tokens of
    a micro-batch (this rank's sequence share under cp), per Note [Recompute modes]
    (docs/memory.md's table): tensor-parallel shares of the heads and MLP units, and under
    sequence parallelism T/tp tokens for the residual-stream tensors (the gathered norm outputs
    stay whole)."""
    s, d, tp = spec.dtype_bytes, spec.d_model, layout.tp
    A = spec.d_model // tp
    K = spec.kv_heads * spec.head_dim // tp
    ff = spec.ffn_hidden // tp
    H = spec.heads // tp
    t_res = tokens // tp if layout.sequence_parallel else tokens
    if mode == "full":
        return [s * d * t_res]
    res = [s * d * t_res] * 4            # block input, attention branch, r, MLP branch
    norms = [s * d * tokens] * 2         # ln_1 and ln_2 outputs (gathered under SP)
    if spec.arch == "gpt2":
        core = [s * (A + 2 * K) * tokens, s * A * tokens]          # qkv, attention output
        mlp = [s * ff * tokens] * (1 if mode == "selective" else 2)  # h (and GELU(h))
        stats = [4 * t_res] * 4 + [4 * H * tokens]                  # mean/rstd x 2, lse
    else:
        core = [s * (A + 2 * K) * tokens, s * A * tokens, s * K * tokens, s * A * tokens]
        mlp = [2 * s * ff * tokens] + ([2 * s * ff * tokens] if mode == "none" else [])
        stats = [4 * t_res] * 2 + [4 * H * tokens]
    return res + norms + core + mlp + stats


def block_activation_bytes(spec, layout, tokens, mode, alloc=None):
    """The bytes of block_activation_tensors, each in its allocator size class when `alloc` is
    given (else exact)."""
    ts = block_activation_tensors(spec, layout, tokens, mode)
    return sum(size_class(t, alloc) for t in ts) if alloc else sum(ts)


# Note [Block backward working set]: what one block's backward adds on top of the activations
# and gradients, in units of its MLP hidden [t, u ff/tp] and residual [t, d] activations (compute
# dtype) and of its largest fp32 weight gradient being formed (u = 2 for llama's gate/up):
# (ff units, d units, weight-gradient units) per arch. Fitted (a grid over halves) to the
# allocator's peaks of one-rank steps (d 128-256, 64-512 tokens per sequence, 2-4 layers, every
# recompute mode), with SELECTIVE_WS ff units more under selective recomputation (the MLP
# activation rebuilt inside the backward). gpt2: 16 steps, at most 3.0% error (re-checked on 10
# steps after the LM head's in-place cross-entropy: within 3.1%). llama: refitted (2026-12-06,
# AMD EPYC Zen 3) on 8 steps once the head's working set lost its second logits buffer, at most
# 2.4% error; the held-out shapes of tests/python/test_plan.py are not among them.
WS = {"gpt2": (1.5, 0, 2.0), "llama": (1.0, 2.0, 0.0)}
SELECTIVE_WS = {"gpt2": 0.0, "llama": 1.5}
# The fraction of a block's linear-output gradients (qkv, proj, MLP in and out) a zb stage
# holds per deferred W (measured: 0.5 of them, 2-rank llama, docs/planner.md).
ZB_DY = 0.5
# What a block recomputed under --recompute full keeps during its own backward.
FULL_KEEPS = {"gpt2": "selective", "llama": "none"}


def block_backward_bytes(spec, layout, tokens):
    """The transient of one block's backward (Note [Block backward working set])."""
    s, d, tp = spec.dtype_bytes, spec.d_model, layout.tp
    ffu = spec.ffn_hidden // tp * (1 if spec.arch == "gpt2" else 2)
    a, b, c = WS[spec.arch]
    # Selective recomputation rebuilds the MLP activation (gpt2's GELU(h), llama's SiLU(g) u)
    # inside the backward: that [t, ff/tp] tensor and its gradient are transient there.
    sel = SELECTIVE_WS[spec.arch] if layout.recompute == "selective" else 0
    return int(s * tokens * ((a + sel) * ffu + b * d) + c * 4 * d * ffu)


def _states(spec, layout, named, alloc, single_process):
    """(params, grads, optimizer, buffers) bytes of this rank's parameters `named` under the
    layout's ZeRO stage (docs/memory.md, "ZeRO stages")."""
    dp = layout.dp * layout.cp  # gradients are reduced over dp x cp
    sc = lambda b: size_class(b, alloc)  # noqa: E731
    # DDP buckets: reverse registration order, closed at 40 MB (--ddp-bucket-mb), padded to dp.
    buckets, cur = [], 0
    for _, n in reversed(named):
        cur += n
        if cur * 4 >= 40e6:
            buckets.append(cur)
            cur = 0
    if cur:
        buckets.append(cur)
    z = layout.zero
    if z == 3:
        # FSDP shards per unit (Note [FSDP prefetch]): wte, wpe, each block, the head + ln_f.
        units = {}
        for k, n in named:
            u = ".".join(k.split(".")[:2]) if k.startswith("h.") else \
                ("post" if k.startswith(("ln_f", "lm_head")) else k)
            units[u] = units.get(u, 0) + n
        buckets = list(units.values())
    padded = [max(1, math.ceil(b / dp)) * dp for b in buckets]
    if z == 3:
        params = sum(sc(4 * p // dp) for p in padded)
    else:
        params = sum(sc(4 * n) for _, n in named)
    if single_process:
        grads = sum(sc(4 * n) for _, n in named)  # p.grad, allocated by backward
    elif z >= 2:
        grads = sum(sc(4 * p // dp) for p in padded)
    else:
        grads = sum(sc(4 * p) for p in padded)
    if z == 0:
        opt = sum(2 * sc(4 * n) for _, n in named)
        bufs = 0
    else:
        # Moments of the shard, the staging of the updated shard (ZeRO-1/2), the reduce-scatter
        # output (ZeRO-1).
        opt = sum(2 * sc(4 * p // dp) for p in padded)
        bufs = sum(sc(4 * p // dp) for p in padded) * ((z in (1, 2)) + (z == 1))
    return params, grads, opt, bufs, padded


def peak_memory(spec, layout, gbs, alloc="td_cpu", timeline=None):
    """(peak bytes of the most loaded rank, breakdown dict of that rank). `timeline`: with
    pp > 1, the schedule's simulated timeline (SimResult.timeline: per rank, (kind, micro-batch,
    chunk, start, end)), whose order decides how many micro-batches' activations a rank holds
    at once; None: one micro-batch at a time (no pipeline)."""
    layers = stage_layers(spec, layout)
    tokens = layout.micro_batch_size * spec.seq_len // layout.cp
    single = layout.world == 1 and layout.zero == 0
    # With gradient accumulation the later micro-batches run with every p.grad already there.
    lazy = single and gbs // (layout.micro_batch_size * layout.dp) == 1
    sc = lambda b: size_class(b, alloc)  # noqa: E731
    s, d, tp = spec.dtype_bytes, spec.d_model, layout.tp
    t_res = tokens // tp if layout.sequence_parallel else tokens
    V = spec.padded_vocab(tp, layout.cp) // tp
    nv = len(layers)
    starts = [sum(layers[:v]) for v in range(nv)]
    best = None
    for r in range(layout.pp):
        chunks = [c * layout.pp + r for c in range(layout.vpp)]
        named, n_blocks = [], 0
        pre = post = False
        for v in chunks:
            named += spec.stage_params(starts[v], layers[v], v == 0, v == nv - 1, tp,
                                       layout.cp, layout.ep)
            pre, post = pre or v == 0, post or v == nv - 1
            n_blocks += layers[v]
        params, grads, opt, bufs, padded = _states(spec, layout, named, alloc, single)
        params += sum(sc(4 * n) for n in spec.buffers()) * len(chunks)
        blk = block_activation_bytes(spec, layout, tokens, layout.recompute, alloc)
        if tp > 1 and layout.recompute != "full" and spec.arch == "gpt2":
            # gpt2's tensor-parallel layers keep two more residual-sized tensors per block (the
            # row-parallel outputs after their reduction, which the bias add keeps; llama's
            # linears have no bias).
            blk += 2 * sc(s * d * t_res)
        pre_out = sc(s * d * t_res) if pre and spec.arch == "gpt2" else 0
        # The head keeps d x [t, d] and d W [V/tp, d] fp32 from its forward, ln_f its input
        # (Note [Chunked LM head]).
        post_out = sc(s * d * tokens) + sc(4 * V * d) + sc(s * d * t_res) if post else 0
        mine = n_blocks * blk + pre_out + post_out  # one micro-batch through all my chunks
        other = 0
        if timeline is not None:
            # Replay this rank's simulated schedule: a (micro-batch, chunk) holds its chunk's
            # activations from the end of its F to the end of its backward (zb: of its W,
            # whose deferred GEMMs keep their inputs, plus the output gradients they wait for
            # from the end of I). The peak of the sum, less the one micro-batch `mine` counts.
            def act(c):
                # + the chunk's received input and its sent output, held for its backward.
                v = c * layout.pp + r
                return layers[v] * blk + (pre_out if v == 0 else 0) + \
                    (post_out if v == nv - 1 else 0) + 2 * sc(s * d * tokens)

            def dys(c):
                v = c * layout.pp + r
                qkv = (spec.d_model + 2 * spec.kv_heads * spec.head_dim) // tp
                ffu = spec.ffn_hidden // tp * (1 if spec.arch == "gpt2" else 2)
                return layers[v] * s * tokens * (qkv + ffu + 2 * d) * ZB_DY
            ev = []
            for kind, _, c, t0, t1 in timeline[r]:
                if kind == "F":
                    ev.append((t1, act(c)))
                elif kind == "B":
                    ev.append((t1, -act(c)))
                elif kind == "I":
                    ev.append((t1, dys(c)))
                elif kind == "W":
                    ev.append((t1, -act(c) - dys(c)))
            cur = peak_held = 0
            for _, delta in sorted(ev, key=lambda e: (e[0], e[1] < 0)):
                cur += delta
                peak_held = max(peak_held, cur)
            other = max(0, peak_held - mine)
        head_ws = 0
        if post:
            # One chunk of fp32 logits (turned into their gradient in place by
            # cross_entropy_sum_and_grad_, no second buffer), its d x rows, and a second d W
            # when there are several chunks.
            rows = max(1, min(tokens, HEAD_CHUNK[alloc] // max(V, 1)))
            logits = 4 * rows * V
            head_ws = sc(logits) + sc(s * rows * d) + \
                (sc(4 * V * d) if -(-tokens // rows) > 1 or tp > 1 else 0)
        bwd_ws = block_backward_bytes(spec, layout, tokens)
        if layout.recompute == "full":
            # The block being recomputed holds, during its backward, what it would keep without
            # any recomputation (the checkpointed forward keeps the MLP activation too), and the
            # recomputed output with its gradient.
            bwd_ws += block_activation_bytes(spec, layout, tokens, FULL_KEEPS[spec.arch],
                                             alloc) + 2 * sc(s * d * t_res)
        # ZeRO-1/2: the parameter all-gather after the step, two buckets at a time. ZeRO-3:
        # the gathered current and prefetched units (docs/memory.md), in backward also the full
        # gradient buckets of up to three units and, for gpt2's tied head, the whole table.
        big = sorted(padded, reverse=True)
        zero_ws = sum(sc(4 * p) for p in big[:2]) if layout.zero and padded else 0
        zero3_bwd = 0
        if layout.zero == 2:
            # ZeRO-2: the full buckets being accumulated in the current backward and up to two
            # whose reduce-scatter is in flight (Note [ZeRO-2 gradient shards]).
            zero3_bwd = sum(sc(4 * p) for p in big[:3])
        if layout.zero == 3:
            zero3_bwd = sum(sc(4 * p) for p in big[:3]) + \
                (sc(4 * V * d) if spec.arch == "gpt2" else 0)
        base = params + opt + bufs
        if layout.zero == 3:
            base += sc(4 * big[0])  # at the forward's end only the head's unit is gathered
            zero3_bwd += zero_ws - sc(4 * big[0])
        # Gradients alive at each moment: the DDP's buckets always; in one plain process p.grad
        # appears as backward completes each parameter (Note [Engine]): the head's first,
        # then block by block from the last.
        by_name = dict(named)
        g_head = sum(sc(4 * n) for k, n in named if not k.startswith("h.")) if lazy else grads
        g_blocks = [sum(sc(4 * n) for k, n in named if k.startswith(f"h.{i}."))
                    for i in sorted({int(k.split(".")[1]) for k in by_name if k.startswith("h.")})]
        g_blk = max(g_blocks) if g_blocks else 0
        blk_first = blk if n_blocks else 0
        if lazy:
            g_at_first, g_at_last = g_head, g_head + max(0, len(g_blocks) - 1) * g_blk
        else:
            g_at_first = g_at_last = grads
        phases = {
            # Note [Memory phases]: the forward's end (the head's working set on the last
            # stage), the head's backward (new d x and d W beside the saved ones), the first and
            # the last block backward, the optimizer step.
            "forward": base + (0 if lazy else grads) + other + mine + head_ws,
            "head_backward": base + (0 if lazy else grads) + other + mine +
            (sc(s * d * tokens) + sc(4 * V * d) if post else 0),
            "backward_first": base + g_at_first + other + mine - post_out + bwd_ws + zero3_bwd,
            "backward_last": base + g_at_last + other + pre_out + blk_first + bwd_ws +
            zero3_bwd,
            "optimizer": base + grads + (zero_ws if layout.zero in (1, 2) else 0),
        }
        phase = max(phases, key=phases.get)
        peak = phases[phase]
        bd = {"rank_pp": r, "params": params, "grads": grads, "optimizer": opt,
              "zero_buffers": bufs + zero_ws, "activations": int(other + mine),
              "head_transient": head_ws, "block_backward": bwd_ws, "phase": phase,
              "phases": {k: int(v) for k, v in phases.items()}}
        if best is None or peak > best[0]:
            best = (int(peak), bd)
    return best
