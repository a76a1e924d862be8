"""`python -m tardelli.checkpoint inspect|convert`: look into a training checkpoint, or rewrite it
at another layout (docs/checkpoints.md).

    python -m tardelli.checkpoint inspect SAVE_OR_STEP_DIR [--json]
    python -m tardelli.launch --nproc 4 -m tardelli.checkpoint convert SRC DST --tp 2 --pp 2

inspect prints the step, the layout that saved it, the model and data position, the files and
every global tensor (shape, dtype). convert loads SRC (a step directory, or a save directory's
latest) into the layout given by the flags (the run's own flags otherwise; the number of ranks
sets the data-parallel size) and saves it under DST as a step directory of the same step, with
DST/latest: the offline form of what `--resume` does at another layout (Note [Layout-free
checkpoints] in include/tardelli/train/train_state.h), e.g. to hand a checkpoint to a job of
another shape or to check a round trip. The tensors are copied, never recomputed, so converting A -> B -> A gives
A's tensors bit for bit.
"""
import argparse
import dataclasses
import json
import os
import sys

import tardelli as td

from . import config as C

# The flags convert accepts: the layout (everything else comes from the checkpoint's run).
_LAYOUT = ("tp", "pp", "vpp", "cp", "ep", "zero", "pipeline_layout", "sequence_parallel",
           "make_vocab_size_divisible_by", "cp_comm")


def _step_dir(path):
    """A step directory: `path` itself when it is a checkpoint, else its latest."""
    if os.path.isfile(os.path.join(path, "meta.json")) or \
            os.path.isfile(os.path.join(path + ".old", "meta.json")):
        return path
    latest = td.checkpoint.find_latest(path)
    if latest is None:
        raise C.ConfigError(f"{path}: neither a checkpoint nor a directory holding one")
    return latest


def _describe(path):
    reader = td.checkpoint.CheckpointReader(_step_dir(path))
    meta = reader.meta()
    index = td.checkpoint.PieceIndex(reader)
    files = reader.files()
    tensors = [{"name": n, "shape": list(index.global_shape(n)), "dtype": index.dtype(n)}
               for n in index.names()]
    return {"path": reader.path(), "step": meta.get("step"),
            "format": meta.get("state_format", 1), "parallel": meta.get("parallel", {}),
            "config": meta.get("config", {}), "data": meta.get("data", {}),
            "optimizer": meta.get("optimizer"), "loss_scaler": meta.get("loss_scaler"),
            "files": [{k: f[k] for k in ("name", "size", "writer")} for f in files],
            "tensors": tensors}


def inspect(path, as_json=False, out=print):
    d = _describe(path)
    if as_json:
        out(json.dumps(d))
        return d
    par, cfg = d["parallel"], d["config"]
    out(f"checkpoint {d['path']}: step {d['step']}, format {d['format']}")
    if par:
        out("layout: " + ", ".join(f"{k} {par[k]}" for k in
                                   ("world", "tp", "pp", "vpp", "dp", "cp", "ep", "zero")
                                   if k in par) +
            (", sequence parallel" if par.get("sequence_parallel") else ""))
    if cfg:
        out(f"model: {cfg.get('arch')} {cfg.get('n_layer')} layers, d_model "
            f"{cfg.get('d_model')}, {cfg.get('n_head')} heads, vocab {cfg.get('vocab_size')}, "
            f"{cfg.get('dtype')}" +
            (f", {cfg['num_experts']} experts" if cfg.get("num_experts") else ""))
    if d["data"]:
        out(f"data: {d['data'].get('consumed_samples')} samples consumed")
    size = sum(f["size"] for f in d["files"])
    out(f"files: {len(d['files'])}, {size / 1e6:.2f} MB, "
        f"{len({f['writer'] for f in d['files']})} writers")
    out(f"tensors: {len(d['tensors'])}")
    width = max((len(t["name"]) for t in d["tensors"]), default=0)
    for t in d["tensors"]:
        out(f"  {t['name']:<{width}}  {str(t['shape']):<18} {t['dtype']}")
    return d


def convert(src, dst, overrides, world=None, out=print):
    """Loads checkpoint `src` at the layout of the saved run's config with `overrides` (a dict
    of layout keys) on the ranks of `world`, and saves it under `dst`. Returns the new step
    directory. The C++ loop does both halves (td::train::Trainer built with CheckpointOnly: the
    data need not be here)."""
    from . import trainer
    step_dir = _step_dir(src)
    reader = td.checkpoint.CheckpointReader(step_dir)
    meta = reader.meta()
    fields = {f.name for f in dataclasses.fields(C.TrainConfig)}
    saved = {k: v for k, v in meta.get("train", {}).items() if k in fields}
    cfg = dataclasses.replace(C.TrainConfig(**saved), **overrides, save=dst, resume=False)
    tok = reader.path() if reader.has_file("vocab.json") else ""
    job = trainer.build(cfg, world, checkpoint_vocab=meta["config"]["vocab_size"],
                        tokenizer_dir=tok)
    job.load_checkpoint(step_dir)
    path = job.save(dst)
    if job.is_main:
        out(f"convert: {reader.path()} -> {path} (tp {cfg.tp}, pp {cfg.pp}, dp {job.dp_size}, "
            f"zero {cfg.zero}, ep {cfg.ep})")
    return path


def _parser():
    p = argparse.ArgumentParser(prog="python -m tardelli.checkpoint",
                                description="Inspect or convert training checkpoints.")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("inspect", help="print a checkpoint's step, layout, files and tensors")
    i.add_argument("path", help="a step directory, or a --save directory (its latest)")
    i.add_argument("--json", action="store_true", help="one JSON object instead of text")
    c = sub.add_parser("convert", help="rewrite a checkpoint at another layout (run it on the "
                       "target's number of ranks with python -m tardelli.launch)")
    c.add_argument("src", help="a step directory, or a --save directory (its latest)")
    c.add_argument("dst", help="the --save directory to write the converted step into")
    defaults = {f.name: f.default for f in dataclasses.fields(C.TrainConfig)}
    for k in _LAYOUT:
        flag = "--" + k.replace("_", "-")
        if isinstance(defaults[k], bool):
            c.add_argument(flag, dest=k, action=argparse.BooleanOptionalAction, default=None)
        else:
            c.add_argument(flag, dest=k, type=type(defaults[k]), default=None)
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.command == "inspect":
            inspect(args.path, args.json)
            return 0
        overrides = {k: getattr(args, k) for k in _LAYOUT if getattr(args, k) is not None}
        convert(args.src, args.dst, overrides, trainer_world())
        return 0
    except (C.ConfigError, td.TardelliError) as e:
        print(f"tardelli.checkpoint: {e}", file=sys.stderr)
        return 2


def trainer_world():
    from .trainer import join_world
    return join_world()
