"""Time of one training step under a layout (docs/planner.md, "Step time"): per-rank compute of
forward, backward and recomputation from the profile's GEMM, attention and bandwidth figures;
the layout's communication from the profile's alpha-beta fits (tp/sp collectives, the cp ring or
all-to-all, ep all-to-alls, pp sends, dp/ZeRO reductions and gathers, with the overlap the
runtime achieves); the pipeline's bubble from the schedule's own simulation
(tardelli.distributed.pipeline.simulate); the optimizer step and the per-step overhead."""
from .layout import microbatches, stage_layers

# Elementwise values per token of one block's forward, in the compute dtype: norms, residual
# adds, bias adds, the activation. Backward moves about twice as many (docs/planner.md).
_EW_D, _EW_FF = 20, 4


def _gemms(spec, layout, tokens, moe=False):
    """(m, n, k) of a block's forward GEMMs on this rank."""
    d, tp = spec.d_model, layout.tp
    qkv = (spec.d_model + 2 * spec.kv_heads * spec.head_dim) // tp
    up = 1 if spec.arch == "gpt2" else 2
    if moe:
        # Each token visits top-k experts (+ the shared ones): the expert GEMMs see
        # tokens x top-k rows over the layer (spread over ep ranks, which also receive as many).
        ff = spec.moe_ffn_hidden
        rows = tokens * spec.moe_top_k
        mlp = [(rows, up * ff, d), (rows, d, ff)]
        if spec.moe_shared_experts:
            fs = spec.moe_shared_experts * ff
            mlp += [(tokens, up * fs, d), (tokens, d, fs)]
        mlp.append((tokens, spec.num_experts, d))  # the router
    else:
        ff = spec.ffn_hidden // tp
        mlp = [(tokens, up * ff, d), (tokens, d, ff)]
    return [(tokens, qkv, d), (tokens, d, spec.d_model // tp)] + mlp


class StepModel:
    """Predicts the step time of layouts for one model on one machine (a profile.Machine)."""

    def __init__(self, spec, machine, nproc):
        self.spec, self.m, self.nproc = spec, machine, nproc
        self.threads = machine.threads(nproc)
        self.slow = machine.contention(nproc)
        self.ew_rate, self.ce_rate = self._probe_rates()

    def _probe_rates(self):
        """Note [Elementwise probes]: what a block costs besides its GEMMs, attention and fixed
        overhead is mostly elementwise work (norms, activation, residual adds, bias adds, the
        recomputed activation), and what the LM head costs besides its GEMMs is the softmax
        cross-entropy over the logits; neither runs at the bandwidth of a plain add (GELU and
        exp are compute-bound). When the profile has probes (one real block and head timed by
        calibrate), these give seconds per elementwise value (20 d + 4 ff per token) and per
        logit: the probe's time less this model's GEMM and attention time for the probe's
        shape. Without probes (hand-written GPU profiles) the bandwidth term is used."""
        probes = [r for r in self.m.p.get("probes", []) if r["arch"] == self.spec.arch]
        if not probes:
            return None, None
        t = min({r["threads"] for r in probes}, key=lambda x: (abs(x - self.threads), -x))
        r = [r for r in probes if r["threads"] == t][0]
        from .layout import Layout, ModelSpec
        ff = 4 * r["d"] if r["arch"] == "gpt2" else (8 * r["d"] // 3 + 63) // 64 * 64
        spec = ModelSpec(r["arch"], 1, r["d"], r["heads"], r["heads"], ff, r["seq"], r["vocab"],
                         self.spec.dtype)
        lay = Layout(micro_batch_size=r["batch"])
        tokens = r["batch"] * r["seq"]
        g = 0.0
        for m, n, k in _gemms(spec, lay, tokens):
            g += self.m.gemm_seconds(m, n, k, spec.dtype, t) + \
                self.m.gemm_seconds(m, k, n, spec.dtype, t) + \
                self.m.gemm_seconds(n, k, m, spec.dtype, t)
        att = 6.0 * r["batch"] * r["seq"] ** 2 * r["d"] / 2
        g += self.m.attention_seconds(att, r["seq"], r["d"] // r["heads"], spec.dtype, t)
        rest = r["block_s"] - g - self.m.block_overhead(r["arch"])
        ew = rest / (tokens * (_EW_D * r["d"] + _EW_FF * ff)) if rest > 0 else None
        dv = r["vocab"] - 64
        hg = sum(self.m.gemm_seconds(a, b, c, spec.dtype, t) - self.m.gemm_seconds(
            a if a != r["vocab"] else 64, b if b != r["vocab"] else 64,
            c if c != r["vocab"] else 64, spec.dtype, t)
            for a, b, c in ((tokens, r["vocab"], r["d"]), (tokens, r["d"], r["vocab"]),
                            (r["vocab"], r["d"], tokens)))
        ce = (r["head_s"] - hg) / (tokens * dv) if r["head_s"] > hg else None
        return ew, ce

    # ---- compute -------------------------------------------------------------------------
    def _gemm(self, m, n, k):
        return self.m.gemm_seconds(m, n, k, self.spec.dtype, self.threads)

    def block_times(self, layout, tokens, moe=False):
        """(forward, backward-input, backward-weight) seconds of one block's compute for one
        micro-batch of `tokens` tokens on this rank."""
        spec, s = self.spec, self.spec.dtype_bytes
        fwd = bi = bw = 0.0
        for m, n, k in _gemms(spec, layout, tokens, moe):
            fwd += self._gemm(m, n, k)
            bi += self._gemm(m, k, n)       # dX = dY W
            bw += self._gemm(n, k, m)       # dW = dY^T X
        T = spec.seq_len // layout.cp
        b = layout.micro_batch_size
        att = 6.0 * b * T * spec.seq_len * spec.d_model / layout.tp / 2
        if layout.cp > 1:
            att = 6.0 * b * spec.seq_len ** 2 * spec.d_model / layout.tp / layout.cp / 2
        t_att = self.m.attention_seconds(att, T, spec.head_dim, spec.dtype, self.threads)
        fwd += t_att / 3
        bi += 2 * t_att / 3
        ff = (spec.moe_ffn_hidden * spec.moe_top_k if moe else spec.ffn_hidden // layout.tp)
        t_res = tokens // layout.tp if layout.sequence_parallel else tokens
        ew = s * (_EW_D * spec.d_model * t_res + _EW_FF * ff * tokens)
        ovh = self.m.block_overhead(spec.arch)
        if self.ew_rate is not None:
            t_ew = self.ew_rate * ew / s  # seconds per value, forward + backward
            fwd += t_ew / 3 + ovh / 3
            bi += 2 * t_ew / 3 + 2 * ovh / 3
        else:
            fwd += self.m.memory_seconds(ew, self.threads) + ovh / 3
            bi += self.m.memory_seconds(2 * ew, self.threads) + 2 * ovh / 3
        return fwd * self.slow, bi * self.slow, bw * self.slow

    def selective_seconds(self, layout, tokens, moe=False):
        """Selective recomputation's cost in one block's backward: the MLP activation (GELU,
        or llama's SiLU x gate) recomputed from its saved input, ff values per token on this
        rank: one elementwise value's cost each (Note [Elementwise probes]; the bandwidth of
        reading and writing them without probes)."""
        spec, s = self.spec, self.spec.dtype_bytes
        ff = (spec.moe_ffn_hidden * spec.moe_top_k if moe else spec.ffn_hidden // layout.tp)
        if self.ew_rate is not None:
            t = self.ew_rate * ff * tokens
        else:
            t = self.m.memory_seconds(2 * s * ff * tokens, self.threads)
        return t * self.slow

    def head_times(self, layout, tokens):
        """(forward, backward) seconds of ln_f + the chunked LM head and loss (its gradient
        GEMMs run in the forward, Note [Chunked LM head])."""
        spec, d = self.spec, self.spec.d_model
        V = spec.padded_vocab(layout.tp, layout.cp) // layout.tp
        f = self._gemm(tokens, V, d) + self._gemm(tokens, d, V) + self._gemm(V, d, tokens)
        if self.ce_rate is not None:
            f += self.ce_rate * tokens * V + self.m.memory_seconds(4 * V * d, self.threads)
        else:
            f += self.m.memory_seconds(4 * 4 * tokens * V + 4 * V * d, self.threads)
        f += self.m.op_seconds(12)
        b = self.m.memory_seconds(3 * 4 * V * d + 3 * 4 * tokens * d, self.threads)
        b += self.m.op_seconds(8)
        return f * self.slow, b * self.slow

    def embed_times(self, layout, tokens):
        spec, d = self.spec, self.spec.d_model
        V = spec.padded_vocab(layout.tp, layout.cp) // layout.tp
        f = self.m.memory_seconds(3 * spec.dtype_bytes * tokens * d, self.threads)
        b = self.m.memory_seconds(4 * (V * d + 2 * tokens * d), self.threads)
        return (f + self.m.op_seconds(4)) * self.slow, (b + self.m.op_seconds(6)) * self.slow

    # ---- communication -------------------------------------------------------------------
    def _coll(self, op, nbytes, group, stride=1):
        """A collective over `group` ranks `stride` apart in rank order (tp 1, cp tp, dp tp x
        cp, pp tp x cp x dp): it leaves the node when the ranks it spans exceed a node."""
        rpn = self.m.p.get("ranks_per_node", 0)
        span = bool(rpn) and group > 1 and (group - 1) * stride + 1 > rpn
        return self.m.collective_seconds(op, nbytes, group, span_nodes=span)

    def _sync(self, op, nbytes, group, stride=1):
        """_coll plus, when ranks outnumber the cores and `group` is not the whole world, the
        wait for a peer that shares a core with a rank still computing (calibrate.py Note
        [Shared-core syncs]); a world-wide group's fits were measured in that state already."""
        t = self._coll(op, nbytes, group, stride)
        if self.slow > 1 and 1 < group < self.nproc:
            t += self.m.p.get("shared_core_sync_s", 0.0)
        return t

    def block_comm(self, layout, tokens, moe=False):
        """(forward, backward) seconds of one block's tp/sp, cp and ep communication."""
        spec, s, tp = self.spec, self.spec.dtype_bytes, layout.tp
        act = s * tokens * spec.d_model
        f = b = 0.0
        if tp > 1:
            if layout.sequence_parallel:
                one = self._sync("all_gather", act, tp) + self._sync("reduce_scatter", act, tp)
                f += 2 * one
                b += 2 * one
                # Replicated parameters on split activations: their gradients are all-reduced
                # per micro-batch (norm weights and biases, row biases).
                b += (6 if spec.arch == "gpt2" else 2) * self._sync("all_reduce", 4 * spec.d_model,
                                                                    tp)
            else:
                f += 2 * self._sync("all_reduce", act, tp)
                b += 2 * self._sync("all_reduce", act, tp)
        if layout.cp > 1:
            K = spec.kv_heads * spec.head_dim // tp
            if layout.cp_comm == "ring":
                kv = 2 * s * tokens * K
                st = layout.cp * tp  # the ring's wrap-around hop spans the whole cp group
                f += (layout.cp - 1) * self._sync("send_recv", kv, 2, st)
                b += (layout.cp - 1) * self._sync("send_recv", kv + 2 * kv * 4 // s, 2, st) + \
                    self._sync("send_recv", 2 * 4 * tokens * K, 2, st)
            else:
                qkv_out = s * tokens * (2 * spec.d_model + 2 * K * tp) // tp
                f += self._sync("all_to_all", qkv_out, layout.cp, tp)
                b += self._sync("all_to_all", qkv_out, layout.cp, tp)
        if moe and layout.ep > 1:
            disp = s * tokens * spec.moe_top_k * spec.d_model
            st = tp * layout.cp
            f += 2 * self._sync("all_to_all", disp, layout.ep, st)
            b += 2 * self._sync("all_to_all", disp, layout.ep, st)
        hidden = 1.0 - self.m.p.get("tp_comm_overlap", 0.0)
        return f * hidden, b * hidden

    # ---- the step ------------------------------------------------------------------------
    def step(self, layout, gbs, sim=None):
        """(seconds, breakdown) of one step of global batch `gbs`. `sim`: the pipeline
        simulation function (tardelli.distributed.pipeline's make_schedule + simulate), needed
        when pp > 1."""
        spec = self.spec
        m = microbatches(layout, gbs)
        tokens = layout.micro_batch_size * spec.seq_len // layout.cp
        layers = stage_layers(spec, layout)
        full = layout.recompute == "full"
        # Per pp rank: forward, backward-input and backward-weight seconds of one micro-batch
        # through all its chunks, compute and communication.
        per_rank, parts = [], []
        fast = []  # the same at full speed (Note [Shared cores in a pipeline])
        nv = len(layers)
        start = [sum(layers[:v]) for v in range(nv)]
        for r in range(layout.pp):
            F = BI = BW = comm_f = comm_b = 0.0
            sel = 0.0  # selective recomputation's activation, in BI
            comp = {"gemm_attn_ew": 0.0, "recompute": 0.0, "head": 0.0, "tp_cp_ep": 0.0}
            for c in range(layout.vpp):
                v = c * layout.pp + r
                for i in range(start[v], start[v] + layers[v]):
                    moe = spec.is_moe(i)
                    f, bi, bw = self.block_times(layout, tokens, moe)
                    cf, cb = self.block_comm(layout, tokens, moe)
                    if layout.recompute == "selective":
                        sel += self.selective_seconds(layout, tokens, moe)
                    F += f
                    BI += bi + (f if full else 0.0)
                    BW += bw
                    comm_f += cf
                    comm_b += cb + (cf if full else 0.0)
                    comp["gemm_attn_ew"] += f + bi + bw
                    comp["recompute"] += f if full else 0.0
                if v == 0:
                    ef, eb = self.embed_times(layout, tokens)
                    F += ef
                    BI += eb
                    if layout.tp > 1:
                        comm_f += self._sync("all_reduce", spec.dtype_bytes * tokens *
                                             spec.d_model, layout.tp)
                if v == nv - 1:
                    hf, hb = self.head_times(layout, tokens)
                    F += hf
                    BI += hb
                    comp["head"] += hf + hb
                    if layout.tp > 1:
                        # The loss's two small all-reduces per chunk and the replicated input's
                        # gradient all-reduce (copy_to_region).
                        comm_f += 2 * self._sync("all_reduce", 8 * tokens, layout.tp)
                        comm_b += self._sync("all_reduce", spec.dtype_bytes * tokens *
                                             spec.d_model, layout.tp)
            BI += sel
            comp["recompute"] += sel
            comp["gemm_attn_ew"] += sel
            comp["tp_cp_ep"] = comm_f + comm_b
            per_rank.append((F + comm_f, BI + comm_b, BW))
            fast.append((F / self.slow + comm_f, BI / self.slow + comm_b, BW / self.slow))
            parts.append(comp)
        worst = max(range(layout.pp), key=lambda r: sum(per_rank[r]))
        tf, tbi, tbw = per_rank[worst]
        bd = {"microbatches": m}
        p2p = 0.0
        if layout.pp > 1:
            # Sends are asynchronous and a stage's next receive is posted while it computes: in
            # the steady state a transfer hides behind the receiver's previous action; it is on
            # the critical path while the pipeline fills and drains, once per virtual-stage
            # boundary each way.
            act = spec.dtype_bytes * tokens * spec.d_model
            one = self._coll("send_recv", act, 2, layout.tp * layout.cp * layout.dp)
            p2p = 2 * (layout.pp * layout.vpp - 1) * one
        if layout.pp > 1:
            if sim is None:
                raise ValueError("StepModel.step: pp > 1 needs the pipeline simulation")
            def run(f, bi, bw):
                if layout.schedule == "zb":
                    return sim(layout.schedule, layout.pp, m, layout.vpp, f, bi, bw)
                # Non-split schedules run B = BI + BW as one action.
                return sim(layout.schedule, layout.pp, m, layout.vpp, f, (bi + bw) / 2,
                           (bi + bw) / 2)
            res = run(tf, tbi, tbw)
            pipe = res.makespan
            if self.slow > 1:
                # Note [Shared cores in a pipeline]: ranks that share cores run at 1 / slow of
                # their speed only while all of them compute; a stage waiting in the bubble
                # leaves its share to the others. The makespan is then bounded below by the
                # schedule at full speed (its critical path) and by the work of the busiest
                # rank at the shared speed (all cores kept busy); it takes the larger bound
                # instead of the schedule run at the shared speed throughout.
                ff, fbi, fbw = fast[worst]
                pipe = max(run(ff, fbi, fbw).makespan, m * (tf + tbi + tbw))
            pipe += p2p
            bd["bubble_fraction"] = res.bubble_fraction
        else:
            pipe = m * (tf + tbi + tbw)
            bd["bubble_fraction"] = 0.0
        bd["compute_ms"] = 1e3 * m * (sum(per_rank[worst]) - parts[worst]["tp_cp_ep"])
        bd["tp_cp_ep_comm_ms"] = 1e3 * m * parts[worst]["tp_cp_ep"]
        bd["pp_p2p_ms"] = 1e3 * p2p
        bd["recompute_ms"] = 1e3 * m * parts[worst]["recompute"]
        bd["pipeline_ms"] = 1e3 * pipe
        dpc, dp_exposed = self.dp_comm(layout, m, tbi + tbw, layers, worst)
        bd["dp_comm_ms"] = 1e3 * dpc
        bd["dp_exposed_ms"] = 1e3 * dp_exposed
        opt = self.optimizer_seconds(layout, layers, worst)
        bd["optimizer_ms"] = 1e3 * opt
        over = self.m.step_overhead(self.nproc)
        bd["overhead_ms"] = 1e3 * over
        total = pipe + dp_exposed + opt + over
        return total, bd

    def _local_params(self, layout, layers, r):
        named = []
        nv = len(layers)
        start = [sum(layers[:v]) for v in range(nv)]
        for c in range(layout.vpp):
            v = c * layout.pp + r
            named += self.spec.stage_params(start[v], layers[v], v == 0, v == nv - 1, layout.tp,
                                            layout.cp, layout.ep)
        return sum(n for _, n in named)

    def _pp_overlap(self):
        # Tardelli reduces a pipelined step's gradients after the schedule (docs/parallelism.md,
        # "Not yet done"); a profile of a runtime that overlaps them says so.
        return self.m.p.get("dp_overlap_with_pp", False)

    def dp_comm(self, layout, m, t_bwd_mb, layers, r):
        """(total, exposed) seconds of the data-parallel gradient and parameter traffic."""
        g = layout.dp * layout.cp
        if g == 1:
            return 0.0, 0.0
        coll = lambda op, b: self._coll(op, b, g, layout.tp)  # noqa: E731
        n = self._local_params(layout, layers, r)
        nbytes = 4 * n  # fp32 gradients
        gather = self.m.p.get("param_gather_bytes", 4) * n  # ZeRO's parameter all-gathers
        z = layout.zero
        ov = self.m.p["overlap"]
        if z == 0:
            t = coll("all_reduce", nbytes)
            hide = t_bwd_mb if layout.pp == 1 or self._pp_overlap() else 0.0
            return t, max(t - ov * hide, (1 - ov) * t)
        if z == 1:
            rs = coll("reduce_scatter", nbytes)
            ag = coll("all_gather", gather)
            hide = t_bwd_mb if layout.pp == 1 or self._pp_overlap() else 0.0
            if self._pp_overlap():
                # Megatron's --overlap-param-gather: the gather hides behind the next forward.
                ag = max(ag - ov * t_bwd_mb / 2, (1 - ov) * ag)
            return rs + ag, max(rs - ov * hide, (1 - ov) * rs) + ag
        if z == 2:
            rs = m * coll("reduce_scatter", nbytes)
            ag = coll("all_gather", gather)
            hide = m * t_bwd_mb
            return rs + ag, max(rs - ov * hide, (1 - ov) * rs) + ag
        # ZeRO-3: parameters gathered before each forward and backward of every micro-batch
        # (prefetched one unit ahead), gradients reduce-scattered per micro-batch.
        ag = 2 * m * coll("all_gather", gather)
        rs = m * coll("reduce_scatter", nbytes)
        hide = m * t_bwd_mb * 1.5
        t = ag + rs
        return t, max(t - ov * hide, (1 - ov) * t)

    def optimizer_seconds(self, layout, layers, r):
        """AdamW over this rank's shard (28 bytes moved per element), the gradient norm and the
        zeroing of the gradients (4 bytes each per local element)."""
        n = self._local_params(layout, layers, r)
        shard = n // (layout.dp * layout.cp) if layout.zero else n
        b = 28 * shard + 8 * n
        return (self.m.memory_seconds(b, self.threads) + self.m.op_seconds(40)) * self.slow
