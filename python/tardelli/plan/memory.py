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
# 2.4% error; the held-out shapes of tests/python/test_plan.py are not among them. llama's
# `none` MLP backward peaks at MulBackward, before h's gradient is formed: mlp_activation's
# single split (one [t, 2 ff] buffer, not two zero-padded ones) left those peaks unchanged.
WS = {"gpt2": (1.5, 0, 2.0), "llama": (1.0, 2.0, 0.0)}
SELECTIVE_WS = {"gpt2": 0.0, "llama": 1.5}
# Note [MLP backward transient]: the [t, ff/tp] tensors (compute dtype) alive at the peak of
# activation_linear's backward (src/ops/activation_linear.cpp), besides the saved h. gpt2: the
# activation's output gradient dm = dy W, and gelu_and_backward's two outputs, gelu(h) and dh.
# llama (SwiGLU, ff the width of one half): dm, silu(gate), the gate's and the up half's
# gradients and their cat ([t, 2 ff]): 6 units (Note [SwiGLU backward memory] frees dm x up,
# silu_backward's input, before the cat; it was a seventh).
MLP_BWD_UNITS = {"gpt2": 3, "llama": 6}


def block_backward_bytes(spec, layout, tokens):
    """The transient of one block's backward (Note [Block backward working set])."""
    s, d, tp = spec.dtype_bytes, spec.d_model, layout.tp
    ffu = spec.ffn_hidden // tp * (1 if spec.arch == "gpt2" else 2)
    a, b, c = WS[spec.arch]
    # Selective recomputation rebuilds the MLP activation (gpt2's GELU(h), llama's SiLU(g) u)
    # inside the backward: that [t, ff/tp] tensor and its gradient are transient there.
    sel = SELECTIVE_WS[spec.arch] if layout.recompute == "selective" else 0
    return int(s * tokens * ((a + sel) * ffu + b * d) + c * 4 * d * ffu)


def tp_bias_output_bytes(spec, layout, tokens, alloc=None):
    """What a gpt2 tensor-parallel block keeps beyond block_activation_bytes: two more
    residual-sized tensors (the row-parallel outputs after their reduction, which the bias add
    keeps; llama's linears have no bias). 0 without tp or for llama."""
    if layout.tp == 1 or spec.arch != "gpt2":
        return 0
    t_res = tokens // layout.tp if layout.sequence_parallel else tokens
    b = spec.dtype_bytes * spec.d_model * t_res
    return 2 * (size_class(b, alloc) if alloc else b)


def full_recompute_backward_bytes(spec, layout, tokens, alloc=None):
    """What one block's backward adds under --recompute full (Note [Full recomputation
    backward]): the checkpoint reruns the block's forward (the GPT's blocks run
    activation_linear, i.e. the selective set) and backpropagates through it, so beside the
    saved block input there live the incoming gradient dy, the recomputed forward's saved
    tensors and output, and, at the MLP's backward, its transient (Note [MLP backward
    transient]). dy and the input are both [t_res, d], so this is the selective set (which counts
    the input) plus the transient."""
    s, d, tp = spec.dtype_bytes, spec.d_model, layout.tp
    sc = (lambda b: size_class(b, alloc)) if alloc else int
    kept = block_activation_bytes(spec, layout, tokens, "selective", alloc) + \
        tp_bias_output_bytes(spec, layout, tokens, alloc)
    ff = spec.ffn_hidden // tp
    u = 1 if spec.arch == "gpt2" else 2
    unit = sc(s * tokens * ff)
    # The transient's peak inside mlp_activation_and_backward, or after it: dm freed, act(h)
    # and dh (u units) with the second linear's fp32 weight gradient [d, ff/tp] being formed.
    mlp = max(MLP_BWD_UNITS[spec.arch] * unit,
              (1 + u) * unit + sc(4 * d * ff))
    return kept + mlp


def _states(spec, layout, named, alloc, single_process):
    """(params, grads, optimizer, buffers) bytes of this rank's parameters `named` under the
    layout's ZeRO stage (docs/memory.md, "ZeRO stages")."""
    dp = layout.dp * layout.cp  # gradients are reduced over dp x cp
    sc = lambda b: size_class(b, alloc)  # noqa: E731
    # DDP buckets: reverse registration order, closed at 40 MB (--ddp-bucket-mb), padded to dp;
    # each a list of its parameters' element counts in bucket order.
    members, cur = [[]], 0
    for _, n in reversed(named):
        members[-1].append(n)
        cur += n
        if cur * 4 >= 40e6:
            members.append([])
            cur = 0
    if not members[-1]:
        members.pop()
    z = layout.zero
    if z == 3:
        # FSDP shards per unit (Note [FSDP prefetch]): wte, wpe, each block, the head + ln_f,
        # each unit's parameters in registration order.
        units = {}
        for k, n in named:
            u = ".".join(k.split(".")[:2]) if k.startswith("h.") else \
                ("post" if k.startswith(("ln_f", "lm_head")) else k)
            units.setdefault(u, []).append(n)
        members = list(units.values())
    buckets = [sum(m) for m in members]
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
        # The two moments per piece, a piece being a parameter's part of the rank's shard of a
        # bucket (src/distributed/distributed_optimizer.cpp): each its own tensor and size
        # class, on the dp rank where they weigh most. Then the staging of the updated shard
        # (ZeRO-1/2) and the reduce-scatter output (ZeRO-1), one per bucket.
        def moments(q):
            tot = 0
            for m, p in zip(members, padded):
                lo, hi, off = q * p // dp, (q + 1) * p // dp, 0
                for n in m:
                    piece = min(hi, off + n) - max(lo, off)
                    tot += 2 * sc(4 * piece) if piece > 0 else 0
                    off += n
            return tot
        opt = max(moments(q) for q in range(dp))
        bufs = sum(sc(4 * p // dp) for p in padded) * ((z in (1, 2)) + (z == 1))
    return params, grads, opt, bufs, padded


def _zb_phases(spec, layout, tokens, alloc, layers, r, actions, blk, pre_out, post_out,
               head_ws, bwd_ws, states):
    """The phases of pp rank r under the zero-bubble schedule, from a replay of its actions
    (Note [Zero-bubble memory], docs/planner.md): {phase: bytes}, `states` included.

    Derived from src/parallel/pipeline_runtime.cpp and src/autograd/weight_grad_store.cpp: an
    I pass is backward_input() with retain_graph, so nothing it runs frees its saved tensors;
    when the stage drops the graph's roots, what the deferred dW closures hold survives to the
    end of W: each GEMM's saved input X, which keeps its grad_fn and so every node upstream
    (every saved tensor of the chunk but the last block's MLP output, and under full
    recomputation each block's recomputed graph), and each GEMM's output gradient dY. A sent
    tensor (a chunk's output, an input gradient) is freed once its send has completed (Note
    [Sent tensors] in src/parallel/pipeline_runtime.cpp): none is counted."""
    sc = lambda b: size_class(b, alloc)  # noqa: E731
    s, d, tp = spec.dtype_bytes, spec.d_model, layout.tp
    t_res = tokens // tp if layout.sequence_parallel else tokens
    nv = len(layers)
    qkv = (d + 2 * spec.kv_heads * spec.head_dim) // tp
    ff = spec.ffn_hidden // tp
    ffu = ff * (1 if spec.arch == "gpt2" else 2)
    V = spec.padded_vocab(tp, layout.cp) // tp
    # The output gradient of each linear, kept by its deferred dW: qkv's, the MLP input's and
    # the two residual-sized ones (the attention projection's and the MLP output's).
    dy_blk = sc(s * tokens * qkv) + sc(s * tokens * ffu) + 2 * sc(s * d * tokens)
    # Under full recomputation the recomputed forward's graph is retained by the deferred GEMMs:
    # its saved set (the selective one) less the block input, which the checkpoint keeps.
    rec_blk = 0
    if layout.recompute == "full":
        rec_blk = block_activation_bytes(spec, layout, tokens, "selective", alloc) - \
            sc(s * d * t_res)
        rec_blk += tp_bias_output_bytes(spec, layout, tokens, alloc)
    # A W pass: the largest fp32 weight gradient being formed; a recomputed MLP activation.
    w_ws = sc(4 * d * max(qkv, ffu, d))
    if layout.recompute != "none":
        w_ws += sc(s * tokens * ff)
    res = sc(s * d * t_res)
    # The MLP's input-gradient transient: gpt2 dm and dh, llama (separate SiLU and product)
    # the gate's and the up half's gradients and their cat; under recomputation
    # activation_linear's (Note [MLP backward transient]).
    units = MLP_BWD_UNITS[spec.arch] if layout.recompute != "none" else \
        {"gpt2": 2, "llama": 4}[spec.arch]
    mlp_i = units * sc(s * tokens * ff)
    cur = 0
    peaks = {"forward": 0, "head_backward": 0, "backward_first": 0, "weight_backward": 0}
    for kind, _, c, _, _ in actions:
        v = c * layout.pp + r
        last = v == nv - 1
        kept = layers[v] * blk + (pre_out if v == 0 else 0) + (sc(s * d * t_res) if v else 0)
        dy = layers[v] * dy_blk
        if kind == "F":
            cur += kept + (post_out if last else 0)
            peaks["forward"] = max(peaks["forward"], cur + (head_ws if last else 0))
            if last:
                peaks["head_backward"] = max(peaks["head_backward"], cur + sc(s * d * tokens) +
                                             sc(4 * V * d))
        elif kind == "I":
            # Nothing is freed inside an I pass (it retains the graph): its peak is at its end,
            # every output gradient formed, with the first block's input gradient being summed
            # (qkv's dX, the norm's, their sum: the gradient sent back), or, if larger, inside
            # the last block's MLP backward.
            end = dy + layers[v] * rec_blk + 3 * res
            mlp = (layers[v] - 1) * (dy_blk + rec_blk) + rec_blk + res + mlp_i
            peaks["backward_first"] = max(peaks["backward_first"], cur + max(end, mlp))
            # Then the graph is dropped but for what the deferred GEMMs hold: the head's saved
            # tensors and the last block's MLP output go.
            cur += dy + layers[v] * rec_blk - (post_out if last else 0) - res
        elif kind == "W":
            peaks["weight_backward"] = max(peaks["weight_backward"], cur + w_ws)
            # The deferred closures (and with them the retained graph) go when W ends.
            cur -= kept - res + dy + layers[v] * rec_blk
    out = {k: states + v for k, v in peaks.items()}
    out["backward_last"] = out["backward_first"]
    return out


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
        if layout.recompute != "full":
            blk += tp_bias_output_bytes(spec, layout, tokens, alloc)
        pre_out = sc(s * d * t_res) if pre and spec.arch == "gpt2" else 0
        # The head keeps d x [t, d] and d W [V/tp, d] fp32 from its forward, ln_f its input
        # (Note [Chunked LM head]).
        post_out = sc(s * d * tokens) + sc(4 * V * d) + sc(s * d * t_res) if post else 0
        mine = n_blocks * blk + pre_out + post_out  # one micro-batch through all my chunks
        other = 0
        zb_timeline = timeline[r] if timeline is not None and layout.schedule == "zb" else None
        if timeline is not None and zb_timeline is None:
            # Replay this rank's simulated schedule: a (micro-batch, chunk) holds its chunk's
            # activations from the end of its F to the end of its backward. The peak of the
            # sum, less the one micro-batch `mine` counts. (zb: _zb_phases.)
            def act(c):
                # + the chunk's received input, held for its backward (the first chunk receives
                # nothing). Its sent output is not: the runtime frees a sent output's data once
                # the send has completed (Note [Sent tensors], docs/planner.md).
                v = c * layout.pp + r
                return layers[v] * blk + (pre_out if v == 0 else 0) + \
                    (post_out if v == nv - 1 else 0) + sc(s * d * tokens) * (v > 0)

            ev = []
            for kind, _, c, t0, t1 in timeline[r]:
                if kind == "F":
                    ev.append((t1, act(c)))
                elif kind == "B":
                    ev.append((t1, -act(c)))
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
        if layout.recompute == "full":
            bwd_ws = full_recompute_backward_bytes(spec, layout, tokens, alloc)
        else:
            bwd_ws = block_backward_bytes(spec, layout, tokens)
        if layout.recompute == "selective":
            # The fit above is too small where a selective block's backward is the peak (a
            # pipeline stage holding several micro-batches): at least the incoming gradient and
            # activation_linear's backward transient (Note [MLP backward transient]) are alive
            # beside the saved set. (Without recomputation the MLP's saved tensors are freed op
            # by op as its backward goes, and the fit stands alone.)
            bwd_ws = max(bwd_ws, sc(s * d * t_res) +
                         MLP_BWD_UNITS[spec.arch] * sc(s * tokens * spec.ffn_hidden // tp))
        # ZeRO-1/2: the parameter all-gather after the step, two buckets at a time.
        big = sorted(padded, reverse=True)
        zero_ws = sum(sc(4 * p) for p in big[:2]) if layout.zero and padded else 0
        zero3_bwd = z3_head = 0
        if layout.zero == 2:
            # ZeRO-2: the full buckets being accumulated in the current backward and up to two
            # whose reduce-scatter is in flight (Note [ZeRO-2 gradient shards]).
            zero3_bwd = sum(sc(4 * p) for p in big[:3])
        base = params + opt + bufs
        if layout.zero == 3:
            # ZeRO-3 (Note [FSDP prefetch], src/distributed/fully_sharded.cpp): at the forward's
            # end the head's unit is gathered (gpt2: the tied wte, which stays gathered through
            # backward; llama: ln_f + lm_head); a block's backward holds its own unit and the
            # prefetched one before it gathered, and its own unit's full gradient bucket until
            # the reduce-scatter.
            dpz = layout.dp * layout.cp
            unit = lambda n: max(1, math.ceil(n / dpz)) * dpz  # noqa: E731
            head_unit = (V * d + (0 if spec.arch == "gpt2" else d)) if post else 0
            blk_units = {}
            for k, n in named:
                if k.startswith("h."):
                    blk_units[k.split(".")[1]] = blk_units.get(k.split(".")[1], 0) + n
            blk_unit = unit(max(blk_units.values())) if blk_units else 0
            z3_head = sc(4 * unit(head_unit)) if head_unit else 0
            zero3_bwd = (3 * sc(4 * blk_unit) if blk_unit else 0) + \
                (z3_head if spec.arch == "gpt2" else 0)
            zero_ws = z3_head
        # Gradients alive at each moment: the DDP's buckets always; in one plain process p.grad
        # appears as backward completes each parameter (Note [Engine]): the head's first,
        # then block by block from the last.
        by_name = dict(named)
        # The head's gradients are ln_f's and the head weight's: gpt2's tied wte gets its head
        # part there, llama's untied wte (and gpt2's wpe) only in the embedding's backward,
        # after every block (Note [Tied embedding gradient]).
        tied = spec.arch == "gpt2" and post
        g_head = sum(sc(4 * n) for k, n in named if k.startswith(("ln_f.", "lm_head.")) or
                     (tied and k == "wte.weight")) if lazy else grads
        # Note [Tied embedding gradient]: with wte and the head on one rank, the AccumulateGrad
        # of wte waits for both uses (src/autograd/engine.cpp), so the head's d W ([V/tp, d]
        # fp32) is held from the head's backward to the embedding's. In one process without
        # accumulation it becomes wte.grad (counted in g_head); otherwise wte.grad or its
        # bucket exists besides it.
        held_dw = sc(4 * V * d) if tied and pre and not lazy else 0
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
            "forward": base + z3_head + (0 if lazy else grads) + other + mine + head_ws,
            "head_backward": base + z3_head + (0 if lazy else grads) + other + mine +
            (sc(s * d * tokens) + sc(4 * V * d) if post else 0),
            "backward_first": base + g_at_first + held_dw + other + mine - post_out + bwd_ws +
            zero3_bwd,
            "backward_last": base + g_at_last + held_dw + other + pre_out + blk_first + bwd_ws +
            zero3_bwd,
            "optimizer": base + grads + (zero_ws if layout.zero in (1, 2) else 0),
        }
        if zb_timeline is not None:
            phases.update(_zb_phases(spec, layout, tokens, alloc, layers, r, zb_timeline, blk,
                                     pre_out, post_out, head_ws, bwd_ws,
                                     base + z3_head + grads))
        phase = max(phases, key=phases.get)
        peak = phases[phase]
        bd = {"rank_pp": r, "params": params, "grads": grads, "optimizer": opt,
              "zero_buffers": bufs + zero_ws, "activations": int(other + mine),
              "head_transient": head_ws, "block_backward": bwd_ws, "phase": phase,
              "phases": {k: int(v) for k, v in phases.items()}}
        if best is None or peak > best[0]:
            best = (int(peak), bd)
    return best
