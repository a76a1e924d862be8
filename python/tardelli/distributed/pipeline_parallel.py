"""Pipeline parallelism for the fused GPT: layers split into stages on the ranks of the pp group,
and one runtime that executes any schedule of td.distributed.pipeline (gpipe, 1f1b,
interleaved, zb) action by action.

    grid = dist.ProcessGrid(world, dist.ParallelDims(tp=2, pp=2, dp=2))
    chunks = build_stages(cfg, grid.coords.pp, pp=2, vpp=1)        # this rank's model chunks
    for c in chunks: dist.parallelize(c, grid, sequence_parallel=True)   # tp inside each stage
    pipe = PipelineRuntime(chunks, grid, "1f1b", microbatches=8, micro_batch_size=2,
                           seq_len=256)
    loss = pipe.step(batches)        # forward + backward of the 8 micro-batches; grads in .grad

Note [Pipeline runtime]:
- Virtual stage s (of pp * vpp) holds layers layout[s] and lives on pp rank s % pp as that
  rank's chunk s // pp (Megatron's interleaved placement). Stage 0 embeds, the last stage runs
  ln_f, the head and the loss.
- Point-to-point: a forward sends the stage's output to the rank of stage s+1, a backward sends
  the input gradient to the rank of stage s-1; sends are asynchronous (waited for at the end of
  the step), a receive blocks until its data is there. Shapes and dtypes are known from the
  config ([micro_batch, seq_len (/tp under sequence parallelism), d_model] in the compute
  dtype), so no shape is exchanged. Every message's tag names (direction, micro-batch, virtual
  stage), so the order in which messages arrive never matters. The schedule generator
  guarantees, and validate() checks, that no rank waits in a cycle.
- The loss of each micro-batch is scaled by 1/m in backward, so gradients are those of the
  mean over the step's micro-batches (the same as one rank with the whole global batch).
- zb: backward is split: BackwardInput runs td.autograd.backward_input (the input gradient
  only; every linear layer's weight-gradient GEMM is deferred) and BackwardWeight runs the
  deferred GEMMs (include/tardelli/autograd/weight_grad_store.h).
- gpt2's tied embedding: with pp > 1 the last stage holds its own copy of wte.weight (the same
  initial values); after the step their gradients are summed over the first and last stage
  (the embedding group), so both copies take identical optimizer steps.
"""
import time

from .. import _C
from . import pipeline as _sched


def stage_layout(n_layer, pp, vpp=1, layout=None):
    """Layers per virtual stage: a list of pp * vpp counts. Even by default (n_layer must be
    divisible by pp * vpp); `layout`, a list of pp * vpp positive counts summing to n_layer,
    gives an uneven split."""
    stages = pp * vpp
    if pp < 1 or vpp < 1:
        raise ValueError(f"pipeline: pp ({pp}) and vpp ({vpp}) must be >= 1")
    if layout is not None:
        layout = [int(x) for x in layout]
        if len(layout) != stages or any(x < 1 for x in layout) or sum(layout) != n_layer:
            raise ValueError(f"pipeline: layout {layout} must give {stages} positive layer "
                             f"counts (pp {pp} x vpp {vpp}) summing to the {n_layer} layers")
        return layout
    if n_layer % stages != 0:
        raise ValueError(f"pipeline: {n_layer} layers are not divisible into pp {pp} x vpp "
                         f"{vpp} = {stages} stages; pass an explicit layout for an uneven split")
    return [n_layer // stages] * stages


def build_stages(config, pp_rank, pp, vpp=1, layout=None):
    """This pp rank's model chunks (td.models.GPT stages), chunk c = virtual stage c*pp+rank."""
    from ..models import GPT
    counts = stage_layout(config.n_layer, pp, vpp, layout)
    starts = [sum(counts[:s]) for s in range(len(counts))]
    chunks = []
    for c in range(vpp):
        s = c * pp + pp_rank
        chunks.append(GPT(config, (starts[s], counts[s], s == 0, s == pp * vpp - 1)))
    return chunks


def _tag(direction, mb, stage, stages):
    return (direction * 1_000_003 + mb) * stages + stage  # unique per message of a step


class PipelineRuntime:
    """Executes this rank's action list of a schedule over its model chunks (Note [Pipeline
    runtime]). grid: a ProcessGrid (uses its pp group and, for gpt2, builds the embedding
    group: a collective over the world, so every rank constructs its runtime together)."""

    def __init__(self, chunks, grid, schedule, microbatches, micro_batch_size, seq_len):
        import tardelli as td
        self.td = td
        self.chunks = list(chunks)
        self.grid = grid
        self.pp_group = grid.pp()
        self.pp = self.pp_group.size
        self.rank = self.pp_group.rank
        self.vpp = len(self.chunks)
        self.stages = self.pp * self.vpp
        self.m = int(microbatches)
        kind = schedule if isinstance(schedule, str) else schedule.kind
        if kind != "interleaved" and self.vpp != 1:
            raise ValueError(f"pipeline: schedule '{kind}' runs one chunk per rank; --vpp "
                             f"{self.vpp} needs the interleaved schedule")
        self.schedule = _sched.make_schedule(kind, self.pp, self.m, self.vpp)
        _sched.validate(self.schedule)
        self.kind = kind
        cfg = self.chunks[0].config
        tp = self.chunks[0].tp_size
        sp = self.chunks[0].sequence_parallel
        self.act_shape = (int(micro_batch_size), int(seq_len) // (tp if sp else 1), cfg.d_model)
        self.act_dtype = cfg.dtype
        # Received activations and gradients live where the chunks' parameters do (a GPU: the
        # pp group then stages them through host memory or moves them over NCCL).
        first = next(iter(self.chunks[0].parameters()), None)
        self.act_device = first.device if first is not None else "cpu"
        self.embedding_group = None
        if cfg.arch == "gpt2" and self.pp > 1:
            w = grid.world()
            on_end = self.rank in (0, self.pp - 1)
            coords = grid.coords
            # One group per (tp, cp, dp) position: cp ranks hold different tokens' gradients,
            # which the dp x cp reduction sums, not this group.
            d = grid.dims
            color = coords.tp + d.tp * (coords.cp + d.cp * coords.dp) if on_end else -1
            self.embedding_group = w.split(color, w.rank, f"embedding{max(color, 0)}")
        # False under ZeRO-2/3: the trainer sums the gradient shards instead
        # (sync_tied_embedding_shard), since the full gradients are gone after each micro-batch.
        self.sync_tied_grads = True
        self.timeline = []  # [(kind, microbatch, chunk, start, end)] of the last step (epoch s)
        self.last_stats = {}

    # ---- helpers ----
    def _holder(self, stage):
        return stage % self.pp

    def _is_last(self, stage):
        return stage == self.stages - 1

    def _recv(self, direction, mb, stage, src):
        t = self.td.empty(*self.act_shape, dtype=self.act_dtype, device=self.act_device)
        self.pp_group.recv(t, src, _tag(direction, mb, stage, self.stages), True).wait()
        return t

    def _send(self, t, direction, mb, stage, dst):
        t = t.contiguous()
        self._pending.append((t, self.pp_group.send(t, dst, _tag(direction, mb, stage,
                                                                  self.stages), True)))

    def step(self, batches, loss_scale=1.0):
        """Forward and backward of the step's m micro-batches (batches: a list of m (x, y)
        pairs; only the first stage reads x and the last reads y). Gradients accumulate into the
        chunks' .grad: those of the mean loss times `loss_scale` (fp16 loss scaling). Returns
        the mean (unscaled) loss over the micro-batches on every pp rank."""
        td = self.td
        if len(batches) != self.m:
            raise ValueError(f"pipeline: {len(batches)} micro-batches given, the schedule has "
                             f"{self.m}")
        self._pending = []
        stash, deferred = {}, {}
        losses = []
        t0 = time.time()
        self.timeline = []
        busy = 0.0
        scale = td.tensor(1.0 / self.m if loss_scale == 1.0 else loss_scale / self.m,
                          device=self.act_device)
        for kind, mb, c in self.schedule.actions[self.rank]:
            s = c * self.pp + self.rank
            chunk = self.chunks[c]
            # Receives happen before the action's clock starts: waiting for a neighbour is
            # bubble, not work (the timeline holds compute only).
            if kind == "F":
                if s == 0:
                    inp = batches[mb][0]
                else:
                    inp = self._recv(0, mb, s, self._holder(s - 1))
                    inp.requires_grad_(True)
                a0 = time.time()  # wall clock: comparable across the ranks of one machine
                out = chunk.forward_stage(inp, batches[mb][1] if self._is_last(s) else None)
                roots = [out]
                if self._is_last(s):
                    losses.append(out.item())
                else:
                    self._send(out.detach(), 0, mb, s + 1, self._holder(s + 1))
                    # A stage's MoE loss terms are backpropagated with its output, seeded like
                    # the loss (Note [MoE losses of a pipeline stage] in src/models/gpt.cpp).
                    aux = chunk.take_moe_loss()
                    if aux is not None:
                        roots.append(aux)
                stash[(mb, c)] = (inp, roots)
            elif kind in ("B", "I"):
                inp, roots = stash.pop((mb, c))
                grad = scale if self._is_last(s) else self._recv(1, mb, s, self._holder(s + 1))
                grads = [grad] + [scale] * (len(roots) - 1)
                a0 = time.time()
                if kind == "B":
                    _C.backward(roots, grads, False, False)
                else:
                    deferred[(mb, c)] = _C.backward_input(roots, grads)
                if s > 0:
                    self._send(inp.grad, 1, mb, s - 1, self._holder(s - 1))
            elif kind == "W":
                a0 = time.time()
                deferred.pop((mb, c)).run()
            else:
                raise RuntimeError(f"pipeline: unknown action {kind}")
            a1 = time.time()
            busy += a1 - a0
            self.timeline.append((kind, mb, c, a0, a1))
        for _, work in self._pending:
            work.wait()
        self._pending = []
        if self.embedding_group is not None and self.sync_tied_grads:
            self._sync_tied_embedding()
        total = time.time() - t0
        self.last_stats = {"step_s": total, "busy_s": busy,
                           "bubble_fraction": 1.0 - busy / total if total > 0 else 0.0}
        # The loss lives on the last stage's rank; share its mean with every pp rank.
        mean = td.tensor([sum(losses) / len(losses) if losses else 0.0])
        if self.pp > 1:
            self.pp_group.all_reduce(mean, "sum")
        return mean.item()

    def forward_only(self, batches):
        """The mean loss of `batches` (any number of (x, y) micro-batches) without autograd:
        each micro-batch goes through the virtual stages in order (evaluation). The same value
        on every pp rank."""
        td = self.td
        self._pending = []
        losses = []
        with td.no_grad():
            for mb, (x, y) in enumerate(batches):
                for s in range(self.stages):
                    if self._holder(s) != self.rank:
                        continue
                    chunk = self.chunks[s // self.pp]
                    inp = x if s == 0 else self._recv(2, mb, s, self._holder(s - 1))
                    out = chunk.forward_stage(inp, y if self._is_last(s) else None)
                    if self._is_last(s):
                        losses.append(out.item())
                    else:
                        self._send(out, 2, mb, s + 1, self._holder(s + 1))
        for _, work in self._pending:
            work.wait()
        self._pending = []
        mean = td.tensor([sum(losses) / len(losses) if losses else 0.0])
        if self.pp > 1:
            self.pp_group.all_reduce(mean, "sum")
        return mean.item()

    def sync_tied_embedding_shard(self, ddp):
        """ZeRO-2/3 (after ddp.finish_grad_sync()): the tied table's gradient lives in dp shards;
        wte.weight is a bucket of its own on both stages (own_bucket / its own ZeRO-3 unit), so
        the two stages' shards cover the same elements and are summed like the full gradient."""
        if self.embedding_group is None:
            return
        for b, (params, _, _) in enumerate(ddp._cpp.bucket_shard_ranges()):
            if [n for n, _, _ in params] == ["wte.weight"]:
                self.embedding_group.all_reduce(ddp._cpp.shard_grad(b), "sum")
                return
        raise RuntimeError("pipeline: no gradient bucket holds wte.weight alone")

    def _sync_tied_embedding(self):
        for ch in self.chunks:
            for name, p in ch.named_parameters():
                if name == "wte.weight" and p.grad is not None:
                    g = p.grad.contiguous()
                    self.embedding_group.all_reduce(g, "sum")
                    p.grad.copy_(g)
                    return

    def gather_timelines(self):
        """Every pp rank's timeline of the last step (a list per pp rank), on every rank: the
        input of td.distributed.pipeline.chrome_trace / plot_timeline / bubble_fraction."""
        import json
        td = self.td
        data = json.dumps(self.timeline).encode()
        n = td.tensor([len(data)], dtype=td.int64)
        sizes = td.zeros(self.pp, dtype=td.int64)
        self.pp_group.all_gather(sizes, n)
        width = int(max(sizes.tolist()))
        buf = td.zeros(width, dtype=td.int64)
        if data:
            buf[:len(data)] = td.tensor(list(data), dtype=td.int64)
        out = td.zeros(self.pp * width, dtype=td.int64)
        self.pp_group.all_gather(out, buf)
        raw = out.tolist()
        result = []
        for r, size in enumerate(sizes.tolist()):
            chunk = bytes(raw[r * width:r * width + int(size)])
            result.append([tuple(x) for x in json.loads(chunk.decode())])
        return result
