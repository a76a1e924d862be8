"""Pipeline parallelism for the fused GPT: layers split into stages on the ranks of the pp group,
and one runtime that executes any schedule of td.distributed.pipeline (gpipe, 1f1b,
interleaved, zb) action by action.

    grid = dist.ProcessGrid(world, dist.ParallelDims(tp=2, pp=2, dp=2))
    chunks = build_stages(cfg, grid.coords.pp, pp=2, vpp=1)        # this rank's model chunks
    for c in chunks: dist.parallelize(c, grid, sequence_parallel=True)   # tp inside each stage
    pipe = PipelineRuntime(chunks, grid, "1f1b", microbatches=8, micro_batch_size=2,
                           seq_len=256)
    loss = pipe.step(batches)        # forward + backward of the 8 micro-batches; grads in .grad

The runtime is C++ (include/tardelli/parallel/pipeline_runtime.h, Note [Pipeline runtime]:
placement, tags, the 1/m loss seeds, zb's split backward, the tied embedding); this module
converts arguments and keeps the Python exception types: a bad layout, a schedule that cannot
take the chunks or a wrong number of micro-batches raise ValueError, the schedule generator's
own checks TardelliError.
"""
from .. import _C

_P = _C.pipeline


def _as_value_error(fn, *args):
    """fn(*args), with a TardelliError raised as a ValueError of the same text (the caller's
    arguments are wrong: the exception type the Python API has always raised)."""
    try:
        return fn(*args)
    except _C.TardelliError as e:
        raise ValueError(str(e)) from None


def stage_layout(n_layer, pp, vpp=1, layout=None):
    """Layers per virtual stage: a list of pp * vpp counts. Even by default (n_layer must be
    divisible by pp * vpp); `layout`, a list of pp * vpp positive counts summing to n_layer,
    gives an uneven split."""
    layout = None if layout is None else [int(x) for x in layout]
    return list(_as_value_error(_P.stage_layout, int(n_layer), int(pp), int(vpp), layout))


def build_stages(config, pp_rank, pp, vpp=1, layout=None):
    """This pp rank's model chunks (td.models.GPT stages), chunk c = virtual stage c*pp+rank."""
    from ..models import GPT
    stage_layout(config.n_layer, pp, vpp, layout)  # a bad layout is a ValueError
    layout = None if layout is None else [int(x) for x in layout]
    return [GPT._wrap(c) for c in
            _P.build_pipeline_stages(config, int(pp_rank), int(pp), int(vpp), layout)]


class PipelineRuntime:
    """Executes this rank's action list of a schedule over its model chunks (Note [Pipeline
    runtime]). grid: a ProcessGrid (uses its pp group and, for gpt2, builds the embedding
    group: a collective over the world, so every rank constructs its runtime together)."""

    def __init__(self, chunks, grid, schedule, microbatches, micro_batch_size, seq_len):
        self.chunks = list(chunks)
        self.grid = grid
        kind = schedule if isinstance(schedule, str) else schedule.kind
        try:
            self._cpp = _P.PipelineRuntime([c._cpp for c in self.chunks], grid, kind,
                                           int(microbatches), int(micro_batch_size), int(seq_len))
        except _C.TardelliError as e:
            if kind != "interleaved" and len(self.chunks) != 1:
                raise ValueError(str(e)) from None  # vpp > 1 needs the interleaved schedule
            raise
        c = self._cpp
        self.kind = kind
        self.schedule = c.schedule
        self.pp_group = c.pp_group
        self.pp, self.rank, self.vpp, self.m = c.pp, c.rank, c.vpp, c.microbatches
        self.stages = self.pp * self.vpp
        self.act_shape = tuple(c.activation_shape)
        self.act_dtype = c.activation_dtype
        self.act_device = c.activation_device
        self.embedding_group = c.embedding_group  # None off the end stages and for llama

    @property
    def sync_tied_grads(self):
        """Whether step() sums the tied wte gradient over the embedding group. False under
        ZeRO-2/3: the trainer sums the gradient shards instead (sync_tied_embedding_shard),
        since the full gradients are gone after each micro-batch."""
        return self._cpp.sync_tied_grads

    @sync_tied_grads.setter
    def sync_tied_grads(self, on):
        self._cpp.sync_tied_grads = bool(on)

    @property
    def timeline(self):
        """[(kind, microbatch, chunk, start, end)] of the last step on this rank (epoch
        seconds, compute only)."""
        return self._cpp.timeline

    @property
    def last_stats(self):
        """{"step_s", "busy_s", "bubble_fraction"} of the last step on this rank."""
        return self._cpp.last_stats

    def step(self, batches, loss_scale=1.0):
        """Forward and backward of the step's m micro-batches (batches: a list of m (x, y)
        pairs; only the first stage reads x and the last reads y). Gradients accumulate into the
        chunks' .grad: those of the mean loss times `loss_scale` (fp16 loss scaling). Returns
        the mean (unscaled) loss over the micro-batches on every pp rank."""
        batches = list(batches)
        try:
            return self._cpp.step(batches, float(loss_scale))
        except _C.TardelliError as e:
            if len(batches) != self.m:
                raise ValueError(str(e)) from None
            raise

    def forward_only(self, batches):
        """The mean loss of `batches` (any number of (x, y) micro-batches) without autograd:
        each micro-batch goes through the virtual stages in order (evaluation). The same value
        on every pp rank."""
        return self._cpp.forward_only(list(batches))

    def sync_tied_embedding_shard(self, ddp):
        """ZeRO-2/3 (after ddp.finish_grad_sync()): the tied table's gradient lives in dp shards;
        wte.weight is a bucket of its own on both stages (own_bucket / its own ZeRO-3 unit), so
        the two stages' shards cover the same elements and are summed like the full gradient."""
        self._cpp.sync_tied_embedding_shard(ddp._cpp)

    def gather_timelines(self):
        """Every pp rank's timeline of the last step (a list per pp rank), on every rank: the
        input of td.distributed.pipeline.chrome_trace / plot_timeline / bubble_fraction."""
        return self._cpp.gather_timelines()
