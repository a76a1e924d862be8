"""Training checkpoints in the layout of docs/checkpoints.md, written through td.checkpoint
(atomic directories with a CRC-32 per file) so the C++ trainer and this CLI read each other's:

    SAVE/latest                 the name of the newest complete step directory
    SAVE/step_00000500/
        meta.json               step, model config, schedule, data position, RNG states, args
        model.safetensors       every parameter by its GPT name (fp32 master weights)
        optimizer.safetensors   "<param>.exp_avg", "<param>.exp_avg_sq"; __metadata__
                                "optimizer": groups (parameter names, hyperparameters), steps
        vocab.json, merges.txt  the tokenizer, when the data came with one
"""
import json
import os

import tardelli as td

from ..optim.optimizer import _step_tensor
from . import config as C


def _named_params(model):
    # The C++ model's list: every parameter once (the tied head is wte.weight).
    return list(model._cpp.named_parameters())


def _schedule_meta(cfg, step):
    return {"max_lr": cfg.lr, "min_lr": cfg.min_lr_value, "warmup_steps": cfg.warmup_steps,
            "decay_steps": cfg.steps, "style": cfg.lr_decay_style, "last_step": step}


def save(root, step, model, opt, cfg, model_cfg, consumed_samples, tokenizer_dir=None):
    """Writes SAVE/step_XXXXXXXX atomically and points SAVE/latest at it; returns its path."""
    name = td.checkpoint.step_dir_name(step)
    path = os.path.join(root, name)
    os.makedirs(root, exist_ok=True)
    params = _named_params(model)
    by_impl = {p._impl_id(): n for n, p in params}
    writer = td.checkpoint.CheckpointWriter(path)
    writer.write_tensors("model.safetensors", dict(params))

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
    opt_meta = {"name": "AdamW", "groups": groups, "step": steps}
    writer.write_tensors("optimizer.safetensors", tensors, {"optimizer": json.dumps(opt_meta)})
    if tokenizer_dir:
        for f in ("vocab.json", "merges.txt"):
            writer.copy_file(f, os.path.join(tokenizer_dir, f))
    seed, offset, sub = model.dropout_generator.get_state()
    meta = {
        "step": step,
        "config": td.checkpoint.config_to_dict(model_cfg),
        "scheduler": _schedule_meta(cfg, step),
        "data": {"consumed_samples": consumed_samples, "seed": cfg.seed, "prefix": cfg.data,
                 "synthetic": cfg.synthetic_data},
        "rng": {"dropout": {"seed": seed, "offset": offset, "subsequence": sub}},
        "train": cfg.to_dict(),
    }
    writer.commit(meta)
    td.checkpoint.update_latest(root, name)
    return path


def load_model(path):
    """A td.models.GPT with the checkpoint's weights, in eval mode (generation, export)."""
    reader = td.checkpoint.CheckpointReader(path)
    model = td.models.GPT(td.checkpoint.config_from_dict(reader.meta()["config"]))
    td.checkpoint.load_model_state(reader, model)
    model.eval()
    return model, reader


def load(path, model, opt, cfg):
    """Restores model, optimizer and RNG state from the step directory `path` into freshly
    built objects; refuses a checkpoint of another model (naming every differing field).
    Returns {"step", "consumed_samples"}."""
    reader = td.checkpoint.CheckpointReader(path)
    reader.verify()
    meta = reader.meta()
    saved_cfg = td.checkpoint.config_from_dict(meta["config"])
    diff = model.config.diff(saved_cfg)
    if diff:
        raise C.ConfigError(f"--resume: checkpoint {path} was saved from a different model "
                            f"(this run vs the checkpoint):\n{diff}")
    saved = meta.get("train", {})
    changed = [k for k in C.RESUME_KEYS if k in saved and saved[k] != getattr(cfg, k)]
    if changed:
        raise C.ConfigError(
            f"--resume: checkpoint {path} was trained with different data settings: " +
            ", ".join(f"{k}: {getattr(cfg, k)!r} vs {saved[k]!r}" for k in changed))
    td.checkpoint.load_model_state(reader, model)

    opt_tensors = reader.read_tensors("optimizer.safetensors")
    opt_meta = json.loads(reader.read_metadata("optimizer.safetensors")["optimizer"])
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
    r = meta["rng"]["dropout"]
    model.dropout_generator.set_state((r["seed"], r["offset"], r["subsequence"]))
    return {"step": meta["step"], "consumed_samples": meta["data"]["consumed_samples"]}
