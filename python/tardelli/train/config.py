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
from dataclasses import dataclass, field, fields


class ConfigError(ValueError):
    """A bad configuration value; the CLI prints it and exits with status 2."""


@dataclass
class TrainConfig:
    # ---- model ----
    arch: str = field(default="gpt2", metadata=dict(help="gpt2 | llama"))
    layers: int = field(default=4, metadata=dict(help="transformer blocks"))
    d_model: int = field(default=256, metadata=dict(help="hidden size"))
    heads: int = field(default=4, metadata=dict(help="attention heads"))
    kv_heads: int = field(default=0, metadata=dict(help="key/value heads (0: = heads; llama)"))
    ffn_hidden: int = field(default=0, metadata=dict(help="MLP hidden size (0: the arch's rule)"))
    seq_len: int = field(default=256, metadata=dict(help="tokens per sample"))
    vocab_size: int = field(default=0, metadata=dict(
        help="vocabulary (0: from the dataset's tokenizer; required with --synthetic-data)"))
    dropout: float = field(default=0.0, metadata=dict(help="dropout probability"))
    dtype: str = field(default="fp32", metadata=dict(help="compute dtype: fp32 | bf16 | fp16"))
    # ---- mixture of experts (docs/moe.md) ----
    num_experts: int = field(default=0, metadata=dict(
        help="routed experts per MoE layer (0: a dense model)"))
    moe_top_k: int = field(default=2, metadata=dict(help="experts each token is routed to"))
    moe_ffn_hidden: int = field(default=0, metadata=dict(
        help="each expert's hidden size (0: the dense MLP's, --ffn-hidden or the arch's rule)"))
    moe_layer_freq: int = field(default=1, metadata=dict(
        help="block i is an MoE block iff i %% F == 0 (1: every block)"))
    moe_shared_experts: int = field(default=0, metadata=dict(
        help="always-on shared experts (one dense MLP of S x the expert hidden size)"))
    moe_aux_loss_coeff: float = field(default=0.01, metadata=dict(
        help="load-balancing (Switch) loss coefficient, per MoE layer"))
    moe_z_loss_coeff: float = field(default=0.0, metadata=dict(
        help="router z-loss (ST-MoE) coefficient, per MoE layer"))
    moe_router_bias_update_rate: float = field(default=0.0, metadata=dict(
        help="aux-loss-free balancing (DeepSeek-V3): expert bias step after each optimizer "
             "step (0: off)"))
    moe_capacity_factor: float = field(default=0.0, metadata=dict(
        help="expert capacity = factor x tokens x top-k / experts, overflow dropped (0: "
             "dropless)"))
    # ---- batch and optimizer ----
    micro_batch_size: int = field(default=8, metadata=dict(help="samples per forward/backward"))
    global_batch_size: int = field(default=0, metadata=dict(
        help="samples per optimizer step (0: micro batch x dp); larger = gradient accumulation"))
    steps: int = field(default=1000, metadata=dict(help="optimizer steps to train in total"))
    lr: float = field(default=6e-4, metadata=dict(help="peak learning rate"))
    min_lr: float = field(default=-1.0, metadata=dict(help="final learning rate (-1: lr / 10)"))
    warmup_steps: int = field(default=0, metadata=dict(
        help="linear warmup steps (Megatron's default 0: the schedule starts at --lr)"))
    lr_decay_style: str = field(default="cosine", metadata=dict(
        help="cosine | linear | constant"))
    weight_decay: float = field(default=0.1, metadata=dict(help="AdamW decoupled weight decay"))
    beta1: float = field(default=0.9, metadata=dict(help="AdamW beta1"))
    beta2: float = field(default=0.95, metadata=dict(help="AdamW beta2"))
    eps: float = field(default=1e-8, metadata=dict(help="AdamW epsilon"))
    clip_grad: float = field(default=1.0, metadata=dict(help="gradient norm clip (0: off)"))
    initial_loss_scale: float = field(default=65536.0, metadata=dict(
        help="--dtype fp16: the dynamic loss scale to start from (x0.5 on inf/nan gradients, "
             "which skip the step)"))
    loss_scale_window: int = field(default=2000, metadata=dict(
        help="--dtype fp16: clean steps in a row before the loss scale doubles"))
    seed: int = field(default=1337, metadata=dict(help="initialization, data order, dropout"))
    device: str = field(default="cpu", metadata=dict(
        help="cpu | cuda | cuda:N: where the model trains (batches are prepared on the host "
             "and copied; several ranks: each on cuda:{local rank %% GPUs}, collectives staged "
             "through host memory)"))
    # ---- data ----
    data: str = field(default="", metadata=dict(help="Megatron dataset prefix (PREFIX.idx/.bin)"))
    split: str = field(default="98,1,1", metadata=dict(help="train,valid,test document ratios"))
    synthetic_data: bool = field(default=False, metadata=dict(
        help="random tokens drawn from the seed instead of a dataset"))
    # ---- parallelism (data parallel size = world size / (tp x cp x pp))
    plan: str = field(default="", metadata=dict(
        help="auto: take tp, pp, vpp, cp, ep, the schedule, micro batch, ZeRO stage and "
             "recomputation from the planner's fastest layout for this world size "
             "(docs/planner.md); empty: as given"))
    plan_profile: str = field(default="", metadata=dict(
        help="with --plan auto: the machine profile (default $TD_PLAN_PROFILE or "
             "~/.cache/tardelli/profile.json; python -m tardelli.plan calibrate)"))
    tp: int = field(default=1, metadata=dict(
        help="tensor-parallel size: each layer's matrices split over this many ranks"))
    sequence_parallel: bool = field(default=False, metadata=dict(
        help="with --tp > 1: also split the activations between layers along the sequence"))
    make_vocab_size_divisible_by: int = field(default=128, metadata=dict(
        help="under --tp, pad the vocabulary to a multiple of this x tp"))
    cp: int = field(default=1, metadata=dict(
        help="context-parallel size: each sequence split over this many ranks (zigzag)"))
    cp_comm: str = field(default="ring", metadata=dict(
        help="with --cp > 1: ring (ring attention) | a2a (all-to-all, Ulysses)"))
    pp: int = field(default=1, metadata=dict(
        help="pipeline-parallel size: the layers split into this many stages"))
    ep: int = field(default=1, metadata=dict(
        help="expert-parallel size: each MoE layer's experts split over this many of the "
             "data-parallel ranks (must divide the data-parallel size)"))
    vpp: int = field(default=1, metadata=dict(
        help="model chunks (virtual stages) per pipeline rank (--schedule interleaved)"))
    schedule: str = field(default="1f1b", metadata=dict(
        help="pipeline schedule: gpipe | 1f1b | interleaved | zb"))
    pipeline_layout: str = field(default="", metadata=dict(
        help="layers per virtual stage, e.g. 3,5 (empty: even split)"))
    trace: str = field(default="", metadata=dict(
        help="with --pp: write the last step's pipeline timeline (Chrome trace JSON) and a PNG"))
    zero: int = field(default=0, metadata=dict(
        help="ZeRO stage: 0 = replicated optimizer, 1 = optimizer state sharded over dp ranks, "
             "2 = + gradients sharded, 3 = + parameters sharded (FSDP); docs/memory.md"))
    offload_optimizer: bool = field(default=False, metadata=dict(
        help="with --zero 1/2/3: master weights and AdamW moments in host memory, the AdamW "
             "step on the CPU"))
    recompute: str = field(default="selective", metadata=dict(
        help="activation recomputation: none | selective (the MLP activation) | full (each "
             "block from its input); never changes losses (docs/memory.md)"))
    recompute_layers: int = field(default=0, metadata=dict(
        help="with --recompute full: only the first N blocks of each pipeline stage/chunk "
             "(0: every block)"))
    hierarchical_reduce: bool = field(default=False, metadata=dict(
        help="two-level data-parallel reductions: inside each node first, then across nodes "
             "(docs/distributed.md)"))
    ranks_per_node: int = field(default=0, metadata=dict(
        help="ranks per node for --hierarchical-reduce (0: from the launcher's environment, "
             "else one node); set it to simulate nodes on one machine"))
    fp8: str = field(default="none", metadata=dict(
        help="FP8 linears in the blocks, emulated: none | hybrid (E4M3 forward, E5M2 "
             "gradients) | e4m3 (every tensor in E4M3); docs/fp8.md"))
    fp8_amax_history: int = field(default=16, metadata=dict(
        help="--fp8: steps of amax history for delayed scaling (0: current scaling)"))
    fp8_margin: float = field(default=0.0, metadata=dict(
        help="--fp8: scales are fp8_max / amax / 2^margin"))
    precision_policy: str = field(default="static", metadata=dict(
        help="per-layer precision of the block linears: static (--fp8 / --precision-map) | "
             "adaptive (each starts at fp8, or bf16 without --fp8, and is promoted to bf16 / "
             "fp32 when its statistics cross the --precision-* thresholds; docs/fp8.md)"))
    precision_map: str = field(default="", metadata=dict(
        help="JSON or TOML file mapping block linears (h.3.mlp.c_fc or blocks.3.mlp_in) to "
             "fp8 | bf16 | fp32; under adaptive, each entry is that linear's lowest precision"))
    precision_fp8_overflow: float = field(default=1e-2, metadata=dict(
        help="adaptive: promote an fp8 linear when this fraction of its quantized values "
             "saturates"))
    precision_fp8_underflow: float = field(default=0.05, metadata=dict(
        help="adaptive: promote an fp8 linear when this fraction of its quantized values "
             "flushes to zero"))
    precision_fp8_error: float = field(default=0.25, metadata=dict(
        help="adaptive: promote an fp8 linear when its output's relative error vs fp32 exceeds "
             "this"))
    precision_bf16_error: float = field(default=0.02, metadata=dict(
        help="adaptive: promote a bf16 linear to fp32 when its output's relative error vs "
             "fp32 exceeds this"))
    precision_stable_steps: int = field(default=100, metadata=dict(
        help="adaptive: demote a promoted linear after this many steps within half the lower "
             "precision's thresholds"))
    grad_compression: str = field(default="none", metadata=dict(
        help="compressed data-parallel gradients with error feedback: none | powersgd | topk "
             "| randomk (docs/distributed.md)"))
    powersgd_rank: int = field(default=4, metadata=dict(
        help="PowerSGD's rank (every matrix's dimensions must be at least this)"))
    topk_ratio: float = field(default=0.01, metadata=dict(
        help="top-k / random-k: the fraction of each bucket's entries a rank sends, in (0, 1]"))
    compression_start_step: int = field(default=0, metadata=dict(
        help="with --grad-compression: the first N steps reduce uncompressed (PyTorch's "
             "start_powerSGD_iter; Note [Compression warm-up])"))
    ddp_bucket_mb: float = field(default=40.0, metadata=dict(
        help="gradient bucket size for overlapped data-parallel reduction (MB)"))
    # ---- evaluation, logging, checkpoints ----
    eval_interval: int = field(default=100, metadata=dict(help="steps between evaluations (0: off)"))
    eval_steps: int = field(default=10, metadata=dict(help="validation micro-batches per eval"))
    log_interval: int = field(default=10, metadata=dict(help="steps between log lines"))
    save: str = field(default="", metadata=dict(help="checkpoint root directory"))
    save_interval: int = field(default=0, metadata=dict(
        help="steps between checkpoints (0: only at the end)"))
    async_save: bool = field(default=False, metadata=dict(
        help="write checkpoints in a background thread: the step only copies the state to "
             "host memory (docs/checkpoints.md)"))
    resume: bool = field(default=False, metadata=dict(
        help="continue from the latest checkpoint under --save"))
    metrics_file: str = field(default="", metadata=dict(help="JSON lines, one per step"))
    exit_interval: int = field(default=0, metadata=dict(
        help="stop (after saving) once the step count is a multiple of this (0: off)"))
    progress: bool = field(default=True, metadata=dict(help="show a progress bar"))
    inject_nonfinite_grad: str = field(default="", metadata=dict(
        help="testing aid: comma-separated steps (1-based) whose backward is seeded with inf "
             "on every rank, so their gradients are non-finite (exercises fp16 step skipping)"))
    inject_nonfinite_loss: str = field(default="", metadata=dict(
        help="testing aid: comma-separated STEP or STEP@RANK (1-based steps, RANK a world "
             "rank; default every rank) whose loss is reported as nan on that rank while the "
             "gradients stay finite (exercises --on-nonfinite)"))
    # ---- fault tolerance ----
    on_nonfinite: str = field(default="raise", metadata=dict(
        help="a step whose loss or gradient norm is inf/nan on any rank: raise (stop with an "
             "error naming the step) | skip (discard its update; the step still counts)"))
    max_skipped_steps: int = field(default=5, metadata=dict(
        help="with --on-nonfinite skip: stop with an error after this many consecutive "
             "skipped steps"))
    straggler_threshold: float = field(default=1.2, metadata=dict(
        help="log a rank whose step compute time exceeds this ratio x the median over ranks "
             "(at most once per --log-interval steps; 0: off)"))

    @property
    def min_lr_value(self):
        return self.lr / 10 if self.min_lr < 0 else self.min_lr

    def to_dict(self):
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in fields(TrainConfig)}
_CHOICES = {"arch": ("gpt2", "llama"), "dtype": ("fp32", "bf16", "fp16"),
            "schedule": ("gpipe", "1f1b", "interleaved", "zb"),
            "lr_decay_style": ("cosine", "linear", "constant"),
            "recompute": ("none", "selective", "full"), "cp_comm": ("ring", "a2a"),
            "on_nonfinite": ("raise", "skip"),
            "grad_compression": ("none", "powersgd", "topk", "randomk"),
            "fp8": ("none", "hybrid", "e4m3"), "precision_policy": ("static", "adaptive")}


def _coerce(name, value, source):
    want = _FIELDS[name].type
    want = {"int": int, "float": float, "str": str, "bool": bool}.get(want, want)
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
        kw = dict(dest=f.name, default=None, help=f.metadata.get("help", ""))
        if f.type == "bool" or f.type is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        else:
            typ = {"int": int, "float": float, "str": str}.get(f.type, f.type)
            p.add_argument(flag, type=typ, choices=_CHOICES.get(f.name), metavar=None
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
    from .. import _C
    try:
        _C.train.validate(cfg.to_dict(), dp_size)
    except _C.train.ConfigError as e:
        raise ConfigError(str(e)) from None


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
