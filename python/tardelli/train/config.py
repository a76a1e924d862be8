"""The training configuration: one flat set of named values, from defaults, then a TOML file
(`--config`), then command-line flags, each overriding the one before.

A TOML file may group keys in tables ([model], [optim], [data], [train], ...): tables are only
for readability and are flattened; keys use the flag names with '_' or '-' ("d_model" or
"d-model"). An unknown key, a value of the wrong type and an inconsistent combination (heads not
dividing d_model, a global batch that is not a multiple of micro batch x data-parallel size, no
data source) are rejected with a message naming the key and the value.
"""
import argparse
import dataclasses
import os
import tomllib
from dataclasses import field, fields

from .. import _C

# A bad configuration value; the CLI prints it and exits with status 2. The training loop's own
# exception type (a ValueError), so its checks and these raise the same error.
ConfigError = _C.train.ConfigError


def _make_config_class():
    """TrainConfig: a dataclass of the training loop's own field table (td::train's kFields,
    src/train/train_config.cpp: name, type, default, help, choices), so the Python front end
    and the C++ loop cannot disagree on a field."""
    import json
    types = {"int": int, "float": float, "str": str, "bool": bool}
    spec = json.loads(_C.train.fields_json())
    cls_fields = [(f["name"], types[f["type"]],
                   field(default=f["default"],
                         metadata=dict(help=f["help"], choices=tuple(f["choices"]))))
                  for f in spec]

    def min_lr_value(self):
        return self.lr / 10 if self.min_lr < 0 else self.min_lr

    def to_dict(self):
        return dataclasses.asdict(self)

    return dataclasses.make_dataclass(
        "TrainConfig", cls_fields, namespace={"min_lr_value": property(min_lr_value),
                                              "to_dict": to_dict,
                                              "__module__": __name__})


TrainConfig = _make_config_class()
_FIELDS = {f.name: f for f in fields(TrainConfig)}
_CHOICES = {f.name: f.metadata["choices"] for f in fields(TrainConfig) if f.metadata["choices"]}


def _coerce(name, value, source):
    want = _FIELDS[name].type
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if want is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if type(value) is not want:
        raise ConfigError(f"{source}: '{name}' must be {want.__name__}, got {value!r}")
    return value


def load_toml(path):
    """The flattened key/value pairs of a TOML config file."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--config: file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML: {e}") from None
    flat = {}

    def walk(table, where):
        for k, v in table.items():
            if isinstance(v, dict):
                walk(v, f"{where}[{k}]")
                continue
            key = k.replace("-", "_")
            if key not in _FIELDS:
                raise ConfigError(f"--config {path}: unknown key '{k}' in {where or 'top level'} "
                                  f"(known: {', '.join(sorted(_FIELDS))})")
            if key in flat:
                raise ConfigError(f"--config {path}: key '{k}' is given twice")
            flat[key] = _coerce(key, v, f"--config {path}")

    walk(doc, "")
    return flat


def build_parser(prog="python -m tardelli.train", extra=None):
    p = argparse.ArgumentParser(prog=prog, description="Train a GPT (see docs/training.md).")
    p.add_argument("--config", help="TOML file of defaults; flags override it")
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        # argparse formats help with %: a literal one is doubled.
        kw = dict(dest=f.name, default=None, help=f.metadata.get("help", "").replace("%", "%%"))
        if f.type is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        else:
            p.add_argument(flag, type=f.type, choices=_CHOICES.get(f.name), metavar=None
                           if f.name in _CHOICES else f.name.upper(), **kw)
    if extra:
        extra(p)
    return p


def parse_config(argv=None, world_size=1):
    """(TrainConfig, argparse namespace) from argv; ConfigError on a bad value. world_size: the
    ranks of the job (data-parallel size = world_size / tp)."""
    args = build_parser().parse_args(argv)
    values = {}
    if args.config:
        values.update(load_toml(args.config))
    for name in _FIELDS:
        v = getattr(args, name)
        if v is not None:
            values[name] = v
    cfg = TrainConfig(**values)
    if cfg.plan:
        cfg = _planned(cfg, world_size)
    mp = cfg.tp * cfg.pp * cfg.cp
    if mp >= 1 and world_size % mp != 0:
        raise ConfigError(f"--tp {cfg.tp} x --cp {cfg.cp} x --pp {cfg.pp} does not divide the "
                          f"{world_size} ranks of this job")
    validate(cfg, world_size // mp if mp >= 1 else 1)
    return cfg, args


def _planned(cfg, world_size):
    """--plan auto: cfg with the layout fields of the planner's fastest layout for world_size
    ranks (every rank computes the same, deterministic choice)."""
    if cfg.plan != "auto":
        raise ConfigError(f"--plan: unknown value {cfg.plan!r} (choose auto, or leave it out)")
    from .. import plan
    try:
        cfg, top = plan.best_layout(cfg, world_size, cfg.plan_profile or None)
    except (plan.ProfileError, plan.PlanError) as e:
        raise ConfigError(f"--plan auto: {e}") from None
    if os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")) == "0":
        print(f"train: --plan auto: {top['flags']} (predicted {top['step_ms']:.1f} ms/step, "
              f"peak {top['peak_mem_bytes'] / 2 ** 20:.1f} MiB per rank)", flush=True)
    return cfg


def validate(cfg, dp_size=1):
    """Checks one configuration; raises ConfigError naming the offending key(s). The rules are
    the training loop's own (td::train::validate, src/train/config_validate.cpp): one set for
    both front ends and the planner. Reads --data's files and --precision-map."""
    _C.train.validate(cfg.to_dict(), dp_size)


def accumulation_steps(cfg, dp_size=1):
    gbs = cfg.global_batch_size or cfg.micro_batch_size * dp_size
    return gbs // (cfg.micro_batch_size * dp_size)


def inject_steps(cfg):
    """The steps of --inject-nonfinite-grad as a set of ints (ValueError when malformed)."""
    return {int(x) for x in cfg.inject_nonfinite_grad.split(",") if x.strip()}


def inject_loss_steps(cfg):
    """The items of --inject-nonfinite-loss as a set of (step, world rank) pairs, rank -1 for
    every rank (ValueError when malformed)."""
    out = set()
    for item in cfg.inject_nonfinite_loss.split(","):
        if item.strip():
            step, at, rank = item.partition("@")
            rank = int(rank) if at else -1
            if at and rank < 0:
                raise ValueError(item)
            out.add((int(step), rank))
    return out


def split_ratios(cfg):
    return tuple(float(x) for x in cfg.split.split(","))


# What a resumed run must share with its checkpoint besides the model (GPTConfig.diff): the
# data order (the position is a sample count into the order these define). Batch sizes may
# change (the position counts samples, as in Megatron), and so may the layout: tp, pp, vpp, dp,
# cp, ep, the ZeRO stage and the vocabulary padding (Note [Layout-free checkpoints] in
# include/tardelli/train/train_state.h).
RESUME_KEYS = ("seq_len", "data", "split", "synthetic_data", "seed")
