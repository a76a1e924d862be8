"""Training checkpoints in the layout of docs/checkpoints.md, written through td.checkpoint
(atomic directories with a CRC-32 per file) so the C++ trainer and this CLI read each other's:

    SAVE/latest                 the name of the newest complete step directory
    SAVE/step_00000500/
        meta.json               step, model config, schedule, data position, RNG states, args
        model.safetensors       every parameter by its GPT name (fp32 master weights), then
                                the buffers (an MoE model's router.expert_bias)
        optimizer.safetensors   "<param>.exp_avg", "<param>.exp_avg_sq"; __metadata__
                                "optimizer": groups (parameter names, hyperparameters), steps
        optimizer.rankNNNNN.safetensors   instead, with --zero 1/2/3: each rank's shard (fp32
                                master and moment slices), one file per rank. Under ZeRO-3
                                the masters are the parameter shards' values, so resuming
                                writes them back into the shards; the model file holds the
                                full parameters, gathered at save time (generate/export work
                                unchanged)
        model.tpNN.safetensors  instead of model.safetensors with --tp > 1: tensor-parallel
                                rank NN's shards under the GPT names; __metadata__ "tp" gives
                                each one's place in the full tensor (ShardSpec) and that
                                rank's sequence-parallel dropout stream
        optimizer.tpNN.safetensors  likewise for the optimizer (without --zero)
        With --ep > 1 the model and optimizer files hold every expert (each rank's experts
        all-gathered over the ep group at save time, Note [Experts in checkpoints]); only the
        ZeRO shard files are per rank.
        model.ppPP.tpNN.safetensors, optimizer.ppPP.tpNN.safetensors   with --pp > 1: one
                                file per (pipeline stage, tp rank) holding that rank's chunks,
                                with each chunk's dropout streams in the "tp" metadata

`model` below is a td.models.GPT, or the list of this rank's pipeline chunks.
        vocab.json, merges.txt  the tokenizer, when the data came with one
"""
import json
import os

import tardelli as td

from .. import _C

from ..optim.optimizer import _step_tensor
from . import config as C


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


def _model_tensors(model, params=None):
    """What a model file holds: the parameters (or `params`, ZeRO-3's gathered ones) and the
    buffers."""
    t = dict(params) if params else dict(_named_params(model))
    t.update(_named_buffers(model))
    return t


def _schedule_meta(cfg, step):
    return {"max_lr": cfg.lr, "min_lr": cfg.min_lr_value, "warmup_steps": cfg.warmup_steps,
            "decay_steps": cfg.steps, "style": cfg.lr_decay_style, "last_step": step}


def _optimizer_tensors(model, opt):
    """(tensors, metadata) of a replicated td.optim.AdamW in the shared layout."""
    by_impl = {p._impl_id(): n for n, p in _named_params(model)}
    groups, steps, tensors = [], {}, {}
    for g in opt.param_groups:
        names = [by_impl[p._impl_id()] for p in g["params"]]
        groups.append({"params": names, "lr": g["lr"], "weight_decay": g["weight_decay"],
                       "beta1": g["betas"][0], "beta2": g["betas"][1], "eps": g["eps"]})
        for p, n in zip(g["params"], names):
            st = opt.state.get(p)
            if not st:
                continue
            steps[n] = int(st["step"].item())
            tensors[n + ".exp_avg"] = st["exp_avg"]
            tensors[n + ".exp_avg_sq"] = st["exp_avg_sq"]
    return tensors, {"optimizer": json.dumps({"name": "AdamW", "groups": groups,
                                              "step": steps})}


# Note [Experts in checkpoints]: an expert-parallel rank holds num_experts / ep of each MoE
# layer's stacked expert tensors (dim 0). Model and optimizer files store the whole tensors, as
# a one-rank run would, so a checkpoint is independent of ep: a run resumes at any ep (without
# ZeRO), and generate / export read it unchanged. Saving all-gathers the slices over the ep
# group (every rank takes part); loading keeps this rank's slice.
def _is_expert_key(key):
    return ".mlp.experts." in key


def _gather_experts(tensors, ep_group):
    """`tensors` (name -> tensor, names of parameters or their moments) with every expert
    entry replaced by the whole tensor, all-gathered over `ep_group` along dim 0. A collective:
    every rank of the group calls it with the same names."""
    if ep_group is None or ep_group.size == 1:
        return tensors
    out = dict(tensors)
    with td.no_grad():
        for k in sorted(tensors):
            if _is_expert_key(k):
                out[k] = _C.distributed.all_gather_along(tensors[k].contiguous(), ep_group, 0)
    return out


def _slice_experts(tensors, model, where):
    """This rank's slice (dim 0) of every expert entry of a checkpoint's whole tensors."""
    first = _chunks(model)[0]
    n, r = first.ep_size, first.ep_rank
    if n == 1:
        return tensors
    out = dict(tensors)
    for k, t in tensors.items():
        if not _is_expert_key(k):
            continue
        if t.shape[0] % n != 0:
            raise C.ConfigError(f"--resume: {where}: '{k}' has {t.shape[0]} experts, not "
                                f"divisible by ep {n}")
        e = t.shape[0] // n
        out[k] = t.narrow(0, r * e, e).contiguous()
    return out


def _load_model_tensors(reader, path, model, f):
    """An expert-parallel model's parameters and buffers from file `f` (whole experts, this
    rank's slice kept), after checking every name and shape."""
    tensors = _slice_experts(dict(reader.read_tensors(f)), model, f"{path}/{f}")
    mine = dict(_named_params(model))
    mine.update(_named_buffers(model))
    if set(tensors) != set(mine):
        raise C.ConfigError(f"--resume: {path}/{f}: tensor names differ (missing "
                            f"{sorted(set(mine) - set(tensors))}, unexpected "
                            f"{sorted(set(tensors) - set(mine))})")
    with td.no_grad():
        for n, p in mine.items():
            if list(tensors[n].shape) != list(p.shape) or tensors[n].dtype != p.dtype:
                raise C.ConfigError(f"--resume: {path}/{f}: '{n}' is {list(tensors[n].shape)} "
                                    f"{tensors[n].dtype}, this run's {list(p.shape)} {p.dtype}")
            p.copy_(tensors[n])


def _shard_file(rank):
    return f"optimizer.rank{rank:05d}.safetensors"


def _tp_file(kind, tp_rank, pp_rank=None):
    if pp_rank is None:
        return f"{kind}.tp{tp_rank:02d}.safetensors"
    return f"{kind}.pp{pp_rank:02d}.tp{tp_rank:02d}.safetensors"


def _gen_state(g):
    if g is None:
        return None
    seed, offset, sub = g.get_state()
    return {"seed": seed, "offset": offset, "subsequence": sub}


def _set_gen(g, st):
    if g is not None and st is not None:
        g.set_state((st["seed"], st["offset"], st["subsequence"]))


def _tp_metadata(model):
    """The "tp" metadata of a shard file: every tensor's ShardSpec and full shape, and each
    chunk's stage and dropout streams."""
    chunks = _chunks(model)
    first = chunks[0]
    meta = {"size": first.tp_size, "rank": first.tp_rank,
            "sequence_parallel": first.sequence_parallel,
            "shards": {n: ch.shard_spec(n) for ch in chunks for n, _ in ch._cpp.named_parameters()},
            "chunks": [{"stage": list(ch.stage), "dropout": _gen_state(ch.dropout_generator),
                        "split_rng": _gen_state(ch.split_generator)} for ch in chunks]}
    if first.split_generator is not None:
        meta["split_rng"] = _gen_state(first.split_generator)
    return {"tp": json.dumps(meta)}


def _place(shard, spec, full):
    """Writes `shard` into `full` at its place (nn::ShardSpec::put; padding dropped)."""
    _C.parallel.put_shard(shard, full, spec["dim"], spec["segments"], spec["parts"],
                             spec["index"])


def assemble_full_state(reader):
    """The full (one-device) model state of a checkpoint, assembled from its tensor- and
    pipeline-parallel shards when it has them: name -> tensor. Used to generate from or export
    such a checkpoint (the tied embedding's pipeline copy holds the same values)."""
    par = reader.meta().get("parallel", {})
    tp, pp = par.get("tp", 1), par.get("pp", 1)
    if tp == 1 and pp == 1:
        return dict(reader.read_tensors("model.safetensors"))
    full = {}
    for p in range(pp):
        for r in range(tp):
            f = _tp_file("model", r, p if pp > 1 else None)
            info = json.loads(reader.read_metadata(f)["tp"])
            for name, t in reader.read_tensors(f).items():
                spec = info["shards"].get(name)
                if spec is None:  # a buffer (router.expert_bias): replicated, whole
                    full.setdefault(name, t)
                    continue
                if name not in full:
                    full[name] = td.zeros(*spec["full_shape"], dtype=t.dtype)
                _place(t, spec, full[name])
    return full


def _zero_tensors(opt, rank, size, stage=1):
    """(tensors, metadata) of this rank's ZeRO shard: named master/moment slices."""
    tensors, other = {}, {}
    for k, v in opt.state_dict().items():
        if isinstance(v, td.Tensor):
            tensors[k] = v
        else:
            other[k] = v
    return tensors, {"zero": json.dumps({"stage": stage, "rank": rank, "dp": size,
                                         "scalars": other})}


def save(root, step, model, opt, cfg, model_cfg, consumed_samples, tokenizer_dir=None,
         world=None, loss_scaler=None, params=None, ep_group=None, nonfinite=None):
    """Writes SAVE/step_XXXXXXXX atomically and points SAVE/latest at it; returns its path.
    Data parallel: rank 0 writes the model (replicated) and the metadata; with ZeRO-1 every
    rank also writes its optimizer shard (Note [Sharded saving] in checkpoint.h: rank 0
    prepares the directory, then the others join, then rank 0 commits). `loss_scaler`: the fp16
    run's td._C.DynamicLossScaler, whose state goes into meta.json ("loss_scaler"). `params`:
    the parameters to write instead of the model's (ZeRO-3: FullyShardedDataParallel.
    full_parameters(), gathered by every rank before the call). `ep_group`: the expert-parallel
    group, over which the experts are gathered (Note [Experts in checkpoints]). `nonfinite`: the
    --on-nonfinite skip counters ({"skips", "consecutive"}), into meta.json ("nonfinite")."""
    rank, size = (world.rank, world.size) if world is not None else (0, 1)
    sharded = bool(cfg.zero)
    first = _chunks(model)[0]
    tp, tp_rank, pp = first.tp_size, first.tp_rank, cfg.pp
    dp = size // (tp * pp)
    # Megatron's order (tp fastest, then dp, pp slowest): world rank = (pp*dp + dp_rank)*tp + tp.
    # Context-parallel ranks (between tp and dp) hold replicas like dp ranks: here dp counts
    # dp x cp and dp_rank is the dp-cp index, so cp rank 0 of dp rank 0 writes the model.
    dp_rank, pp_rank = (rank // tp) % dp, rank // (tp * dp)
    dp_first = dp_rank == 0
    split = tp > 1 or pp > 1  # one model file per (stage, tp rank)
    shard_pp = pp_rank if pp > 1 else None
    name = td.checkpoint.step_dir_name(step)
    path = os.path.join(root, name)
    writer = None
    # Writers: rank 0 always; with ZeRO-1 every rank (its optimizer shard; id = world rank);
    # with tp or pp > 1 the ranks of data-parallel rank 0 (their model shards; id = their index
    # pp_rank * tp + tp_rank, which is their world rank).
    writer_id = rank if sharded else (pp_rank * tp + tp_rank if dp_first else None)
    num_writers = size if sharded else tp * pp
    # Every rank takes part in gathering the experts; the writers use the result.
    model_tensors = _gather_experts(_model_tensors(model, params), ep_group)
    opt_tensors = None
    if not sharded:
        opt_tensors = _optimizer_tensors(model, opt)
        opt_tensors = (_gather_experts(opt_tensors[0], ep_group), opt_tensors[1])
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        writer = td.checkpoint.CheckpointWriter(path, 0)
    if world is not None:
        world.barrier()
    if rank != 0 and writer_id is not None:
        writer = td.checkpoint.CheckpointWriter(path, writer_id)
    if sharded:
        tensors, metadata = _zero_tensors(opt, rank, size, int(cfg.zero))
        writer.write_tensors(_shard_file(rank), tensors, metadata)
    if split and dp_first:
        writer.write_tensors(_tp_file("model", tp_rank, shard_pp), model_tensors,
                             _tp_metadata(model))
        if not sharded:
            writer.write_tensors(_tp_file("optimizer", tp_rank, shard_pp), *opt_tensors)
    if rank == 0:
        if not split:
            writer.write_tensors("model.safetensors", model_tensors)
            if not sharded:
                writer.write_tensors("optimizer.safetensors", *opt_tensors)
        if tokenizer_dir:
            for f in ("vocab.json", "merges.txt"):
                writer.copy_file(f, os.path.join(tokenizer_dir, f))
    elif writer is not None:
        writer.finish()
    if world is not None:
        world.barrier()
    if rank == 0:
        seed, offset, sub = first.dropout_generator.get_state()
        meta = {
            "step": step,
            "config": td.checkpoint.config_to_dict(model_cfg),
            "scheduler": _schedule_meta(cfg, step),
            "data": {"consumed_samples": consumed_samples, "seed": cfg.seed,
                     "prefix": cfg.data, "synthetic": cfg.synthetic_data},
            "rng": {"dropout": {"seed": seed, "offset": offset, "subsequence": sub}},
            "parallel": {"dp": dp // cfg.cp, "cp": cfg.cp, "tp": tp, "pp": pp, "vpp": cfg.vpp,
                         "ep": first.ep_size,
                         "pipeline_layout": cfg.pipeline_layout, "world": size,
                         "zero": int(cfg.zero), "sequence_parallel": first.sequence_parallel},
            "train": cfg.to_dict(),
        }
        if loss_scaler is not None:
            meta["loss_scaler"] = loss_scaler.state_dict()
        if nonfinite is not None:
            meta["nonfinite"] = dict(nonfinite)
        writer.commit(meta, num_writers)
        td.checkpoint.update_latest(root, name)
    if world is not None:
        world.barrier()  # nobody resumes or exits before the checkpoint is in place
    return path


def load_model(path):
    """A td.models.GPT with the checkpoint's weights, in eval mode (generation, export)."""
    reader = td.checkpoint.CheckpointReader(path)
    model = td.models.GPT(td.checkpoint.config_from_dict(reader.meta()["config"]))
    if reader.meta().get("parallel", {}).get("tp", 1) == 1:
        td.checkpoint.load_model_state(reader, model)
    else:
        model.load_state_dict(assemble_full_state(reader), strict=False)
    model.eval()
    return model, reader


def load(path, model, opt, cfg, world=None, fsdp=None):
    """Restores model, optimizer and RNG state from the step directory `path` into freshly
    built objects; refuses a checkpoint of another model (naming every differing field).
    Returns {"step", "consumed_samples", "loss_scaler", "nonfinite"} (the last two None when
    the checkpoint holds no fp16 loss-scaler state or --on-nonfinite counters). fsdp: the
    ZeRO-3 wrapper, whose shards take the parameters (the model's own tensors hold no values
    between uses). An expert-parallel model keeps its slice of the saved experts (Note [Experts
    in checkpoints])."""
    reader = td.checkpoint.CheckpointReader(path)
    reader.verify()
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
    par = meta.get("parallel", {})
    saved_tp = par.get("tp", 1)
    if saved_tp != first.tp_size:
        raise C.ConfigError(
            f"--resume: {path} holds tensor-parallel shards for tp={saved_tp} but this run has "
            f"tp={first.tp_size}; loading at another tensor-parallel size (resharding) is not "
            "supported yet: resume with --tp " + str(saved_tp))
    saved_pp = (par.get("pp", 1), par.get("vpp", 1), par.get("pipeline_layout", ""))
    if saved_pp != (cfg.pp, cfg.vpp, cfg.pipeline_layout):
        raise C.ConfigError(
            f"--resume: {path} holds pipeline stages for pp={saved_pp[0]}, vpp={saved_pp[1]}, "
            f"layout {saved_pp[2]!r} but this run has pp={cfg.pp}, vpp={cfg.vpp}, layout "
            f"{cfg.pipeline_layout!r}; re-partitioning a checkpoint is not supported yet")
    split = first.tp_size > 1 or cfg.pp > 1
    rank = world.rank if world is not None else 0
    pp_rank = rank // (first.tp_size * (world.size // (first.tp_size * cfg.pp))) \
        if world is not None else 0
    shard_pp = pp_rank if cfg.pp > 1 else None
    if fsdp is not None:
        _load_sharded_model(reader, path, model, fsdp,
                            _tp_file("model", first.tp_rank, shard_pp) if split else
                            "model.safetensors", split)
    elif not split and first.ep_size > 1:
        _load_model_tensors(reader, path, model, "model.safetensors")
    elif not split:
        td.checkpoint.load_model_state(reader, model)
    else:
        _load_tp_model(reader, path, model, _tp_file("model", first.tp_rank, shard_pp))
    rank, size = (world.rank, world.size) if world is not None else (0, 1)
    if cfg.zero:
        saved_world = par.get("world", par.get("dp", 1))
        if par.get("ep", 1) != first.ep_size:
            raise C.ConfigError(
                f"--resume: {path} holds ZeRO-{cfg.zero} optimizer shards of an ep="
                f"{par.get('ep', 1)} run but this run has ep={first.ep_size}; resharding ZeRO "
                "state is not supported yet (resume with the same --ep, or without --zero)")
        if saved_world != size:
            raise C.ConfigError(
                f"--resume: {path} holds ZeRO-{cfg.zero} optimizer shards of {saved_world} "
                f"ranks but this run has {size}; resharding is not supported yet")
        shard = dict(reader.read_tensors(_shard_file(rank)))
        shard.update(json.loads(reader.read_metadata(_shard_file(rank))["zero"])["scalars"])
        opt.load_state_dict(shard)
        if fsdp is not None:
            # The masters are bitwise the parameter shards' values at save time.
            opt.write_masters_to_param_shards()
    else:
        _load_optimizer(reader, path, model, opt,
                        _tp_file("optimizer", first.tp_rank, shard_pp) if split else
                        "optimizer.safetensors")
    if cfg.pp == 1:
        r = meta["rng"]["dropout"]
        first.dropout_generator.set_state((r["seed"], r["offset"], r["subsequence"]))
    return {"step": meta["step"], "consumed_samples": meta["data"]["consumed_samples"],
            "loss_scaler": meta.get("loss_scaler"), "nonfinite": meta.get("nonfinite")}


def _load_sharded_model(reader, path, model, fsdp, f, split):
    """ZeRO-3: the checkpoint's parameters (full, or this tp rank's shards) into the FSDP
    shards, after the same name (and shard layout) checks as the replicated loaders."""
    tensors = dict(reader.read_tensors(f))
    buffers = dict(_named_buffers(model))
    for n, b in buffers.items():
        if n not in tensors:
            raise C.ConfigError(f"--resume: {path}/{f}: buffer '{n}' is missing")
        with td.no_grad():
            b.copy_(tensors.pop(n))
    names = set(fsdp.param_names)
    if set(tensors) != names:
        raise C.ConfigError(f"--resume: {path}/{f}: parameter names differ (missing "
                            f"{sorted(names - set(tensors))}, unexpected "
                            f"{sorted(set(tensors) - names)})")
    if split:
        info = json.loads(reader.read_metadata(f)["tp"])
        owner = {n: ch for ch in _chunks(model) for n, _ in ch._cpp.named_parameters()}
        for n in tensors:
            if info["shards"][n] != owner[n].shard_spec(n):
                raise C.ConfigError(f"--resume: {path}/{f}: '{n}' is the shard "
                                    f"{info['shards'][n]} but this run's layout needs "
                                    f"{owner[n].shard_spec(n)}")
        saved = {tuple(c["stage"]): c for c in info.get("chunks", [])}
        for ch in _chunks(model):
            c = saved.get(tuple(ch.stage))
            if c is not None:
                _set_gen(ch.dropout_generator, c.get("dropout"))
                _set_gen(ch.split_generator, c.get("split_rng"))
            elif "split_rng" in info:
                _set_gen(ch.split_generator, info["split_rng"])
    fsdp.load_full_parameters(tensors)


def _load_tp_model(reader, path, model, f):
    """This rank's shard file `f` (its tp shards of its pipeline chunks) and the chunks' dropout
    streams, after checking each tensor's recorded place in the full tensor against this run's
    layout."""
    chunks = _chunks(model)
    info = json.loads(reader.read_metadata(f)["tp"])
    tensors = _slice_experts(dict(reader.read_tensors(f)), model, f"{path}/{f}")
    params = dict(_named_params(model))
    owner = {n: ch for ch in chunks for n, _ in ch._cpp.named_parameters()}
    for n, b in _named_buffers(model):  # replicated buffers (router.expert_bias), whole
        if n not in tensors:
            raise C.ConfigError(f"--resume: {path}/{f}: buffer '{n}' is missing")
        with td.no_grad():
            b.copy_(tensors.pop(n))
    if set(tensors) != set(params):
        raise C.ConfigError(f"--resume: {path}/{f}: parameter names differ (missing "
                            f"{sorted(set(params) - set(tensors))}, unexpected "
                            f"{sorted(set(tensors) - set(params))})")
    with td.no_grad():
        for n, p in params.items():
            want = owner[n].shard_spec(n)
            if info["shards"][n] != want or list(tensors[n].shape) != list(p.shape):
                raise C.ConfigError(f"--resume: {path}/{f}: '{n}' is the shard "
                                    f"{info['shards'][n]} but this run's layout needs {want}")
            p.copy_(tensors[n])
    saved = {tuple(c["stage"]): c for c in info.get("chunks", [])}
    for ch in chunks:
        c = saved.get(tuple(ch.stage))
        if c is not None:
            _set_gen(ch.dropout_generator, c.get("dropout"))
            _set_gen(ch.split_generator, c.get("split_rng"))
        elif "split_rng" in info:
            _set_gen(ch.split_generator, info["split_rng"])


def _load_optimizer(reader, path, model, opt, fname="optimizer.safetensors"):
    opt_tensors = _slice_experts(dict(reader.read_tensors(fname)), model, f"{path}/{fname}")
    opt_meta = json.loads(reader.read_metadata(fname)["optimizer"])
    params = dict(_named_params(model))
    by_impl = {p._impl_id(): n for n, p in params.items()}
    if len(opt_meta["groups"]) != len(opt.param_groups):
        raise C.ConfigError(f"--resume: {path} has {len(opt_meta['groups'])} optimizer groups, "
                            f"this run {len(opt.param_groups)}")
    for g, sg in zip(opt.param_groups, opt_meta["groups"]):
        names = [by_impl[p._impl_id()] for p in g["params"]]
        if names != sg["params"]:
            raise C.ConfigError(f"--resume: {path}: optimizer group parameters differ")
        g["lr"], g["weight_decay"], g["eps"] = sg["lr"], sg["weight_decay"], sg["eps"]
        g["betas"] = (sg["beta1"], sg["beta2"])
        for p, n in zip(g["params"], names):
            if n not in opt_meta["step"]:
                continue
            opt.state[p] = {"step": _step_tensor(opt_meta["step"][n]),
                            "exp_avg": opt_tensors[n + ".exp_avg"].clone(),
                            "exp_avg_sq": opt_tensors[n + ".exp_avg_sq"].clone()}
