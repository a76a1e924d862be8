"""Training checkpoints in the layout of docs/checkpoints.md, written through td.checkpoint
(atomic directories with a CRC-32 per file). Format 2 (Note [Layout-free checkpoints]):

    SAVE/latest                 the name of the newest complete step directory
    SAVE/step_00000500/
        meta.json               step, model config, schedule, data position, optimizer step,
                                the saving layout ("parallel"), rank 0's RNG state, args
        shards.rankNNNNN.safetensors, shards.rankNNNNN.index.json
                                rank NNNNN's pieces of the global tensors: parameters and
                                buffers by their GPT names, AdamW moments as "<param>.exp_avg"
                                and "<param>.exp_avg_sq"; each piece is a box of the global
                                (one-device) tensor (include/tardelli/checkpoint/sharded_state.h)
        rng.rankNNNNN.json      rank NNNNN's dropout streams (exact resume at the same layout),
                                and per chunk its block linears' names, FP8 scalings and
                                precision-policy state (train/precision.py; kept at any layout)
        vocab.json, merges.txt  the tokenizer, when the data came with one

Note [Layout-free checkpoints]: a rank saves what it holds as boxes of the global tensors: a
tensor-parallel shard is one box per ShardSpec segment, an expert-parallel slice a box of dim 0,
a ZeRO shard (a flat range of the rank's local tensor) a few boxes per parameter; replicas
(dp, cp, tp-replicated tensors, gpt2's pipeline copy of the tied table) are saved by one rank
only. Loading computes the boxes this run's layout needs and reads them from whatever pieces
cover them, so `--resume` works at any tp, pp, vpp, dp, cp, ep and ZeRO stage, with the same
data position; the masters are the fp32 parameters, so only the moments are saved besides them.
Only the dropout streams are per layout: at the same layout every rank gets its own back
(bitwise resume); at another, every chunk takes rank 0's stream (losses then match only
without dropout). A whole-tensor checkpoint (model.safetensors + optimizer.safetensors: the
C++ trainer's, examples/train_gpt.cpp) loads the same way.

`model` below is a td.models.GPT, or the list of this rank's pipeline chunks.
"""
import json
import os
import re
import time

import tardelli as td

from .. import _C

from ..distributed.expert_parallel import is_expert_parameter
from ..optim.optimizer import _step_tensor
from . import config as C
from . import precision

FORMAT = 2
_MOMENTS = ("exp_avg", "exp_avg_sq")
_ZERO_KEY = re.compile(r"^(.*)\.(master|exp_avg|exp_avg_sq)\[(\d+):(\d+)\]$")
_ck = _C.checkpoint


def _chunks(model):
    return list(model) if isinstance(model, (list, tuple)) else [model]


def _named_params(model):
    # The C++ models' lists: every parameter once (the tied head is wte.weight); a pipeline
    # rank's chunks hold distinct names.
    return [nt for ch in _chunks(model) for nt in ch._cpp.named_parameters()]


def _named_buffers(model):
    # The MoE routers' expert_bias (not trained, replicated: equal on every dp rank because
    # the trainer sums the router loads over dp before each bias update); none when dense.
    return [nt for ch in _chunks(model) for nt in ch._cpp.named_buffers()]


def _schedule_meta(cfg, step):
    return {"max_lr": cfg.lr, "min_lr": cfg.min_lr_value, "warmup_steps": cfg.warmup_steps,
            "decay_steps": cfg.steps, "style": cfg.lr_decay_style, "last_step": step}


def _gen_state(g):
    if g is None:
        return None
    seed, offset, sub = g.get_state()
    return {"seed": seed, "offset": offset, "subsequence": sub}


def _set_gen(g, st):
    if g is not None and st is not None:
        g.set_state((st["seed"], st["offset"], st["subsequence"]))


def _narrow(t, box):
    for d, (o, n) in enumerate(zip(*box)):
        t = t.narrow(d, o, n)
    return t


class _Place:
    """Where this rank's copy of parameter `name` of chunk `ch` lies in the global tensor:
    global shape, local shape, and the (local box, global box) pairs; whether this rank is the
    one that saves it among its replicas (given the rank's dp/cp/edp coordinates being 0)."""

    def __init__(self, ch, name):
        spec = ch.shard_spec(name)
        full = list(spec["full_shape"])
        self.shape = full
        base = list(full)
        shift = 0
        if is_expert_parameter(name) and ch.ep_size > 1:
            base[0] = full[0] // ch.ep_size  # this rank's slice of the stacked experts
            shift = ch.ep_rank * base[0]
        self.map = _ck.shard_placement(spec["dim"], spec["segments"], spec["parts"],
                                       spec["index"], base)
        if shift:
            self.map = [(loc, ((g[0][0] + shift,) + tuple(g[0][1:]), g[1]))
                        for loc, g in self.map]
        split = spec["dim"] >= 0 and spec["parts"] > 1
        self.local = list(base)
        if split:
            self.local[spec["dim"]] = sum(spec["segments"]) // spec["parts"]
        # Replicated over tp: tp rank 0 saves; gpt2's tied table on a stage without the
        # embeddings is a copy of the first stage's.
        self.owner = (split or ch.tp_rank == 0) and not (name == "wte.weight" and
                                                        not ch.stage[2])

    def pieces(self, name, t):
        """(name, global shape, global box, data) of the whole local tensor `t`."""
        return [(name, self.shape, g, _narrow(t, loc).contiguous()) for loc, g in self.map]

    def flat_pieces(self, name, flat, begin, end):
        """The pieces of flat elements [begin, end) of the local tensor, given as `flat` (the
        1-D slice a ZeRO shard holds)."""
        buf = td.zeros(*self.local) if self.local else td.zeros(())
        buf.reshape(-1)[begin:end] = flat
        out = []
        for fb in _ck.flat_range_boxes(self.local, begin, end):
            for loc, g in _ck.map_local_box(self.map, fb):
                out.append((name, self.shape, g, _narrow(buf, loc).contiguous()))
        return out

    def read(self, index, name):
        """The local tensor of global tensor `name` (zeros where the shard is padding)."""
        out = td.zeros(*self.local)
        for loc, g in self.map:
            _narrow(out, loc).copy_(index.read(name, g))
        return out

    def read_flat(self, index, name, begin, end):
        """Flat elements [begin, end) of the local tensor of global tensor `name`."""
        out = td.zeros(*self.local)
        for fb in _ck.flat_range_boxes(self.local, begin, end):
            for loc, g in _ck.map_local_box(self.map, fb):
                _narrow(out, loc).copy_(index.read(name, g))
        return out.reshape(-1)[begin:end].clone()


def _places(model):
    return {n: _Place(ch, n) for ch in _chunks(model) for n, _ in ch._cpp.named_parameters()}


def _saves_replicas(grid, name):
    """Whether this rank saves the replicated copies of `name` that it holds: the first dp and
    cp rank (for an expert: the first expert-data-parallel rank)."""
    if grid is None:
        return True
    c = grid.coords
    expert = is_expert_parameter(name) and grid.dims.ep > 1
    return c.cp == 0 and (c.edp == 0 if expert else c.dp == 0)


def _optimizer_step(opt):
    """The optimizer's step count (AdamW: every parameter's, the same; ZeRO: the shard's)."""
    if hasattr(opt, "state_dict") and not isinstance(opt, td.optim.AdamW):
        st = opt.state_dict().get("step")
        return int(st.item()) if st is not None else 0
    steps = {int(s["step"].item()) for s in opt.state.values() if s}
    return max(steps) if steps else 0


def _rank_pieces(model, opt, cfg, grid, params):
    """This rank's pieces (Note [Layout-free checkpoints])."""
    places = _places(model)
    pieces = []
    values = dict(params) if params else dict(_named_params(model))
    for n, t in values.items():
        pl = places[n]
        if pl.owner and _saves_replicas(grid, n):
            pieces += pl.pieces(n, t)
    for n, b in _named_buffers(model):
        if _saves_replicas(grid, n) and (grid is None or grid.coords.tp == 0):
            pieces.append((n, list(b.shape), ([0] * b.dim(), list(b.shape)), b.contiguous()))
    if cfg.zero:
        for key, v in opt.state_dict().items():
            m = _ZERO_KEY.match(key)
            if m is None or m.group(2) == "master":
                continue  # "step" goes to meta.json; the masters are the parameters
            n, kind, a, b = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
            if places[n].owner:
                pieces += places[n].flat_pieces(f"{n}.{kind}", v, a, b)
    else:
        by_impl = {p._impl_id(): n for n, p in _named_params(model)}
        for p, st in opt.state.items():
            n = by_impl[p._impl_id()]
            if st and places[n].owner and _saves_replicas(grid, n):
                for kind in _MOMENTS:
                    pieces += places[n].pieces(f"{n}.{kind}", st[kind])
    return pieces


def _rng_state(model):
    """This rank's per-layout state: each chunk's dropout streams, and its block linears' FP8
    scalings and precision-policy state (train/precision.py: identical on every rank holding
    the same layers, so a resume at another layout keeps them)."""
    return {"chunks": [{"stage": list(ch.stage), "dropout": _gen_state(ch.dropout_generator),
                        "split_rng": _gen_state(ch.split_generator),
                        **precision.chunk_state(ch)}
                       for ch in _chunks(model)]}


def _rng_file(rank):
    return f"rng.rank{rank:05d}.json"


def _comm_file(rank):
    return f"compression.rank{rank:05d}.safetensors"


def _layout(cfg, world, model):
    first = _chunks(model)[0]
    size = world.size if world is not None else 1
    return {"dp": size // (first.tp_size * cfg.pp * cfg.cp), "cp": cfg.cp, "tp": first.tp_size,
            "pp": cfg.pp, "vpp": cfg.vpp, "ep": first.ep_size,
            "pipeline_layout": cfg.pipeline_layout, "world": size, "zero": int(cfg.zero),
            "sequence_parallel": first.sequence_parallel}


class _Save:
    """One checkpoint save of this rank, split into what must run on the training thread
    (prepare: the pieces, the writer, the metadata; commit) and what may run in the background
    (write: the files)."""

    def __init__(self, root, step, model, opt, cfg, model_cfg, consumed_samples, tokenizer_dir,
                 world, loss_scaler, params, grid, nonfinite, compressors=(), snapshot=False):
        self.world = world
        self.rank, self.size = (world.rank, world.size) if world is not None else (0, 1)
        self.root, self.name = root, td.checkpoint.step_dir_name(step)
        self.path = os.path.join(root, self.name)
        self.step = step
        first = _chunks(model)[0]
        self.pieces = _rank_pieces(model, opt, cfg, grid, params)
        self.devices = []
        if snapshot:
            # Note [Async save]: host copies of every piece, taken now; the step's tensors may
            # change as soon as this returns. A GPU tensor's copy is a page-locked buffer filled
            # on the device's snapshot stream without blocking (Note [Host snapshot] in
            # include/tardelli/core/cuda_runtime.h); write() waits for it.
            gpus = {str(t.device): t.device for _, _, _, t in self.pieces
                    if t.device.type != "cpu"}
            self.devices = [gpus[k] for k in sorted(gpus)]
            self.pieces = [(n, shape, box, _ck.host_snapshot(t))
                           for n, shape, box, t in self.pieces]
        self.rng = json.dumps(_rng_state(model)).encode()
        # The compressors' error feedback (per rank, Note [Error feedback]): "<i>/<name>".
        self.comm_state = {f"{i}/{k}": _ck.host_snapshot(v) if snapshot else v
                           for i, c in enumerate(compressors) for k, v in c.state().items()}
        self.tokenizer_dir = tokenizer_dir if self.rank == 0 else None
        self.meta = None
        if self.rank == 0:
            self.meta = {
                "step": step,
                "state_format": FORMAT,
                "config": td.checkpoint.config_to_dict(model_cfg),
                "scheduler": _schedule_meta(cfg, step),
                "data": {"consumed_samples": consumed_samples, "seed": cfg.seed,
                         "prefix": cfg.data, "synthetic": cfg.synthetic_data},
                "rng": {"dropout": _gen_state(first.dropout_generator)},
                "optimizer": {"name": "AdamW", "step": _optimizer_step(opt)},
                "parallel": _layout(cfg, world, model),
                "train": cfg.to_dict(),
            }
            if loss_scaler is not None:
                self.meta["loss_scaler"] = loss_scaler.state_dict()
            if nonfinite is not None:
                self.meta["nonfinite"] = dict(nonfinite)
        # Note [Sharded saving]: rank 0's writer clears a stale .tmp before the others open it.
        if self.rank == 0:
            os.makedirs(root, exist_ok=True)
            self.writer = td.checkpoint.CheckpointWriter(self.path, 0)
        if world is not None:
            world.barrier()
        if self.rank != 0:
            self.writer = td.checkpoint.CheckpointWriter(self.path, self.rank)

    def write(self):
        """This rank's files (and, on ranks other than 0, its manifest)."""
        for dev in self.devices:
            _ck.wait_host_snapshot(dev)  # Note [Host snapshot]: the copies have landed
        _ck.write_pieces(self.writer._w, self.rank, self.pieces)
        self.writer.write_bytes(_rng_file(self.rank), self.rng)
        if self.comm_state:
            self.writer.write_tensors(_comm_file(self.rank), self.comm_state)
        if self.tokenizer_dir:
            for f in ("vocab.json", "merges.txt"):
                self.writer.copy_file(f, os.path.join(self.tokenizer_dir, f))
        if self.rank != 0:
            self.writer.finish()
        self.pieces = None  # the host copies are no longer needed

    def commit(self):
        """Rank 0, once every rank's write() has finished: meta.json, the rename, latest."""
        if self.rank == 0:
            self.writer.commit(self.meta, self.size)
            td.checkpoint.update_latest(self.root, self.name)


def save(root, step, model, opt, cfg, model_cfg, consumed_samples, tokenizer_dir=None,
         world=None, loss_scaler=None, params=None, grid=None, nonfinite=None, compressors=()):
    """Writes SAVE/step_XXXXXXXX atomically and points SAVE/latest at it; returns its path.
    Every rank writes its pieces and RNG file (Note [Sharded saving] in checkpoint.h: rank 0
    prepares the directory, then the others join, then rank 0 commits). `loss_scaler`: the fp16
    run's td._C.DynamicLossScaler, whose state goes into meta.json ("loss_scaler"). `params`:
    the parameters to write instead of the model's (ZeRO-3: FullyShardedDataParallel.
    full_parameters(), gathered by every rank before the call). `grid`: the run's ProcessGrid
    (None for one process), which says which replica saves. `nonfinite`: the --on-nonfinite
    skip counters ({"skips", "consecutive"}), into meta.json ("nonfinite"). `compressors`: the
    gradient compressors of this rank, whose error feedback goes into a per-rank file."""
    job = _Save(root, step, model, opt, cfg, model_cfg, consumed_samples, tokenizer_dir, world,
                loss_scaler, params, grid, nonfinite, snapshot=False, compressors=compressors)
    job.write()
    if world is not None:
        world.barrier()
    job.commit()
    if world is not None:
        world.barrier()  # nobody resumes or exits before the checkpoint is in place
    return job.path


class AsyncSaver:
    """Note [Async save] (--async-save): save() snapshots this rank's pieces into host memory,
    opens the checkpoint's writers (a barrier, as a synchronous save) and returns; a background
    thread writes the files. The commit needs every rank's files, so it happens on the training
    thread: poll(), called after every step while a save is pending, exchanges each rank's
    (finished, failed) flags in one small all-reduce, and once all have finished rank 0 commits
    (meta.json last, then the rename: Note [Commit protocol]) and moves `latest`. At most one
    save is in flight: a new save, and the end of training (wait()), first wait for the
    pending one and commit it. A crash while the thread writes leaves only the .tmp directory,
    never read: the previous checkpoint stays the latest. The thread is a daemon, so a run that
    fails does not wait for it (its .tmp is removed by the next save of that step). Test-only:
    TD_TEST_ASYNC_SAVE_DELAY=SECONDS makes the thread sleep before writing."""

    def __init__(self, world=None):
        self.world = world
        self.pending = None  # (_Save, thread, [error])

    def save(self, *args, **kwargs):
        """As save() (same arguments); returns the path the checkpoint will have."""
        import threading
        self.wait()
        job = _Save(*args, **kwargs, snapshot=True)
        error = []

        delay = float(os.environ.get("TD_TEST_ASYNC_SAVE_DELAY", "0") or 0)

        def run():
            try:
                if delay > 0:
                    time.sleep(delay)  # test-only: a slow disk, so a test can kill the writer
                job.write()
            except BaseException as e:  # noqa: BLE001 - reported on the training thread
                error.append(e)

        thread = threading.Thread(target=run, name=f"tardelli-save-{job.step}", daemon=True)
        thread.start()
        self.pending = (job, thread, error)
        return job.path

    def _agree(self, done, failed):
        """(every rank done, some rank failed): one all-reduce of (done, -failed) with min."""
        if self.world is None or self.world.size == 1:
            return done, failed
        t = td.tensor([int(done), -int(failed)], dtype=td.int64)
        self.world.all_reduce(t, "min")
        return bool(t[0].item()), bool(-t[1].item())

    def poll(self, block=False):
        """Commits the pending save when every rank has written its files (block: waits for
        this rank's thread first). Returns the committed path, or None. A collective whenever a
        save is pending: every rank calls it at the same points."""
        if self.pending is None:
            return None
        job, thread, error = self.pending
        if block:
            thread.join()
        done, failed = self._agree(not thread.is_alive(), bool(error))
        if failed:
            self.pending = None
            mine = f": {error[0]}" if error else " on another rank"
            raise RuntimeError(f"train: the background save of {job.path} failed{mine}")
        if not done:
            return None
        job.commit()
        self.pending = None
        return job.path

    def wait(self):
        """Waits for the pending save (if any) and commits it; returns its path or None."""
        return self.poll(block=True)


def _index(reader, path):
    """The PieceIndex of a checkpoint (format 2, or whole-tensor files); a format-1 checkpoint
    with tensor-parallel, pipeline or ZeRO shard files is refused by name."""
    meta = reader.meta()
    if meta.get("state_format", 1) < 2:
        legacy = [f["name"] for f in reader.files()
                  if f["name"].startswith(("model.tp", "model.pp", "optimizer.rank"))]
        if legacy:
            raise C.ConfigError(
                f"{path}: a format-1 checkpoint with per-layout shard files ({legacy[0]}, ...); "
                "this version reads format 2 (layout-free) and whole-tensor checkpoints: load "
                "it with the version that wrote it at its layout and save again")
    return _ck.PieceIndex(reader._r)


def _model_names(index):
    return [n for n in index.names() if not n.endswith((".exp_avg", ".exp_avg_sq"))]


def assemble_full_state(reader):
    """The full (one-device) model state of a checkpoint: name -> tensor, whatever layout saved
    it (generate, export)."""
    index = _index(reader, reader.path())
    return {n: index.read_full(n) for n in _model_names(index)}


def load_model(path):
    """A td.models.GPT with the checkpoint's weights, in eval mode (generation, export)."""
    reader = td.checkpoint.CheckpointReader(path)
    model = td.models.GPT(td.checkpoint.config_from_dict(reader.meta()["config"]))
    model.load_state_dict(assemble_full_state(reader), strict=False)
    model.eval()
    return model, reader


def _saved_step(reader, meta):
    """The optimizer step count of a checkpoint (a whole-tensor one keeps AdamW's per-parameter
    steps in optimizer.safetensors' metadata)."""
    if "optimizer" in meta:
        return int(meta["optimizer"]["step"])
    if reader.has_file("optimizer.safetensors"):
        saved = json.loads(reader.read_metadata("optimizer.safetensors")["optimizer"])
        return max(saved["step"].values(), default=0)
    return 0


def load(path, model, opt, cfg, world=None, fsdp=None, compressors=()):
    """Restores model, optimizer and RNG state from the step directory `path` into freshly
    built objects, at this run's layout whatever layout saved it (Note [Layout-free
    checkpoints]); refuses a checkpoint of another model (naming every differing field) or of
    other data settings. Returns {"step", "consumed_samples", "loss_scaler", "nonfinite",
    "resharded"} (the scaler's state and the --on-nonfinite counters None when the checkpoint
    has none). fsdp: the ZeRO-3 wrapper, whose shards
    take the parameters (the model's own tensors hold no values between uses)."""
    reader = td.checkpoint.CheckpointReader(path)
    meta = reader.meta()
    saved_cfg = td.checkpoint.config_from_dict(meta["config"])
    first = _chunks(model)[0]
    diff = first.config.diff(saved_cfg)
    if diff:
        raise C.ConfigError(f"--resume: checkpoint {path} was saved from a different model "
                            f"(this run vs the checkpoint):\n{diff}")
    saved = meta.get("train", {})
    changed = [k for k in C.RESUME_KEYS if k in saved and saved[k] != getattr(cfg, k)]
    if changed:
        raise C.ConfigError(
            f"--resume: checkpoint {path} was trained with different data settings: " +
            ", ".join(f"{k}: {getattr(cfg, k)!r} vs {saved[k]!r}" for k in changed))
    index = _index(reader, path)
    places = _places(model)
    try:
        if fsdp is not None:
            fsdp.load_full_parameters({n: places[n].read(index, n) for n in fsdp.param_names})
        else:
            with td.no_grad():
                for n, p in _named_params(model):
                    p.copy_(places[n].read(index, n))
        with td.no_grad():
            for n, b in _named_buffers(model):
                b.copy_(index.read_full(n))
        step = _saved_step(reader, meta)
        if cfg.zero:
            state = {}
            for key, v in opt.state_dict().items():
                m = _ZERO_KEY.match(key)
                if m is None:
                    if key == "step":
                        state[key] = td.full(list(v.shape), step, dtype=v.dtype)
                    continue
                n, kind, a, b = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
                src = n if kind == "master" else f"{n}.{kind}"
                state[key] = places[n].read_flat(index, src, a, b)
            opt.load_state_dict(state)
            if fsdp is not None:
                # The masters are bitwise the parameter shards' values at save time.
                opt.write_masters_to_param_shards()
        else:
            by_impl = {p._impl_id(): n for n, p in _named_params(model)}
            for g in opt.param_groups:
                for p in g["params"]:
                    n = by_impl[p._impl_id()]
                    if not index.has(f"{n}.exp_avg"):
                        continue  # saved before any optimizer step
                    opt.state[p] = {"step": _step_tensor(step),
                                    **{k: places[n].read(index, f"{n}.{k}") for k in _MOMENTS}}
    except td.TardelliError as e:
        raise C.ConfigError(f"--resume: {path}: {e}") from None
    finally:
        index.release()
    rank = world.rank if world is not None else 0
    same_layout = meta.get("parallel") == _layout(cfg, world, model)
    if same_layout and reader.has_file(_rng_file(rank)):
        saved_rng = {tuple(c["stage"]): c for c in
                     json.loads(reader.read_bytes(_rng_file(rank)))["chunks"]}
        for ch in _chunks(model):
            c = saved_rng.get(tuple(ch.stage), {})
            _set_gen(ch.dropout_generator, c.get("dropout"))
            _set_gen(ch.split_generator, c.get("split_rng"))
            precision.load_chunk_state(ch, [c])
    else:
        if "rng" in meta:
            for ch in _chunks(model):
                _set_gen(ch.dropout_generator, meta["rng"]["dropout"])
        # The block linears' state is the same on every rank holding a layer: found by name.
        saved = precision.saved_chunks_of(reader, meta.get("parallel", {}).get("world", 1),
                                          _rng_file)
        for ch in _chunks(model):
            precision.load_chunk_state(ch, saved)
    # Error feedback is per rank: restored at the same layout, else it starts at zero (what
    # the residuals carried is then lost, as after a change of dp in any compressed run).
    comm_restored = False
    if compressors and same_layout and reader.has_file(_comm_file(rank)):
        saved_comm = reader.read_tensors(_comm_file(rank))
        for i, c in enumerate(compressors):
            prefix = f"{i}/"
            c.load_state({k[len(prefix):]: v for k, v in saved_comm.items()
                          if k.startswith(prefix)})
        comm_restored = True
    return {"step": meta["step"], "consumed_samples": meta["data"]["consumed_samples"],
            "loss_scaler": meta.get("loss_scaler"), "nonfinite": meta.get("nonfinite"),
            "resharded": not same_layout,
            "error_feedback_reset": bool(compressors) and not comm_restored}
