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
import math
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


def validate_precision(cfg, need):
    """--fp8 and the per-layer precision flags (docs/fp8.md)."""
    need(cfg.fp8 == "none" or cfg.cp == 1,
         f"--fp8 {cfg.fp8} with --cp {cfg.cp}: FP8 linears under context parallelism are not "
         "supported yet")
    for k in ("fp8_overflow", "fp8_underflow", "fp8_error", "bf16_error"):
        v = getattr(cfg, f"precision_{k}")
        need(math.isfinite(v) and v >= 0,
             f"--precision-{k.replace('_', '-')} must be >= 0, got {v}")
    need(cfg.precision_stable_steps >= 1,
         f"--precision-stable-steps must be >= 1, got {cfg.precision_stable_steps}")
    if cfg.precision_policy == "adaptive" or cfg.precision_map:
        flag = "--precision-policy adaptive" if cfg.precision_policy == "adaptive" else \
            "--precision-map"
        need(cfg.zero < 3, f"{flag} with --zero 3: bf16/fp32 linears and the statistics "
             "need the fp32 weights, which ZeRO-3 releases between uses")
    if cfg.precision_map:
        pmap = read_precision_map(cfg.precision_map, cfg.layers)
        fp8 = sorted(k for k, v in pmap.items() if v == "fp8")
        need(not fp8 or cfg.fp8 != "none",
             f"--precision-map {cfg.precision_map}: entry '{fp8[0] if fp8 else ''}' is fp8 "
             "but --fp8 is none")


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
    """Checks one configuration; raises ConfigError naming the offending key(s)."""
    def need(cond, msg):
        if not cond:
            raise ConfigError(msg)

    for name, choices in _CHOICES.items():
        v = getattr(cfg, name)
        need(v in choices, f"--{name.replace('_', '-')}: unknown value {v!r} "
             f"(choose from {', '.join(choices)})")
    for name in ("layers", "d_model", "heads", "seq_len", "micro_batch_size", "steps"):
        need(getattr(cfg, name) > 0, f"--{name.replace('_', '-')} must be > 0, "
             f"got {getattr(cfg, name)}")
    for name in ("kv_heads", "ffn_hidden", "vocab_size", "global_batch_size", "warmup_steps",
                 "eval_interval", "eval_steps", "save_interval", "exit_interval"):
        need(getattr(cfg, name) >= 0, f"--{name.replace('_', '-')} must be >= 0, "
             f"got {getattr(cfg, name)}")
    need(cfg.zero in (0, 1, 2, 3), f"--zero must be 0, 1, 2 or 3, got {cfg.zero}")
    need(not cfg.offload_optimizer or cfg.zero >= 1,
         "--offload-optimizer needs --zero 1, 2 or 3: the offloaded state is the sharded "
         "distributed optimizer's (as in DeepSpeed and Megatron)")
    need(cfg.zero < 2 or cfg.schedule != "zb",
         f"--zero {cfg.zero} with --schedule zb is not supported yet (the deferred weight "
         "gradients would arrive after the per-micro-batch gradient reduce-scatter)")
    need(cfg.device == "cpu" or cfg.device == "cuda" or cfg.device.startswith("cuda:"),
         f"--device: expected cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.device != "cpu":
        import tardelli as td
        need(td.cuda.is_available(), f"--device {cfg.device}: no CUDA device is available "
             f"(td.cuda.device_count() == 0; this build has the CUDA backend: "
             f"{td.cuda.is_built()})")
        need(cfg.cp == 1 and cfg.ep == 1,
             f"--device {cfg.device} with --cp {cfg.cp} / --ep {cfg.ep}: context and expert "
             "parallelism run on CPU ranks only for now (data, tensor, sequence and pipeline "
             "parallelism and ZeRO run on GPUs)")
    need(cfg.tp >= 1, f"--tp must be >= 1, got {cfg.tp}")
    need(not cfg.sequence_parallel or cfg.tp > 1,
         "--sequence-parallel needs tensor parallelism (--tp > 1)")
    need(cfg.make_vocab_size_divisible_by >= 1,
         f"--make-vocab-size-divisible-by must be >= 1, got {cfg.make_vocab_size_divisible_by}")
    need(cfg.pp >= 1 and cfg.vpp >= 1, f"--pp and --vpp must be >= 1, got {cfg.pp}, {cfg.vpp}")
    need(cfg.vpp == 1 or cfg.schedule == "interleaved",
         f"--vpp {cfg.vpp} needs --schedule interleaved")
    need(cfg.schedule != "interleaved" or cfg.vpp >= 2,
         "--schedule interleaved needs --vpp >= 2 model chunks per rank")
    if cfg.pipeline_layout:
        try:
            counts = [int(x) for x in cfg.pipeline_layout.split(",")]
        except ValueError:
            counts = []
        need(len(counts) == cfg.pp * cfg.vpp and all(c >= 1 for c in counts) and
             sum(counts) == cfg.layers,
             f"--pipeline-layout {cfg.pipeline_layout!r} must list {cfg.pp * cfg.vpp} positive "
             f"layer counts (--pp x --vpp) summing to --layers {cfg.layers}")
    else:
        need(cfg.layers % (cfg.pp * cfg.vpp) == 0,
             f"--layers {cfg.layers} is not divisible by --pp {cfg.pp} x --vpp {cfg.vpp} "
             "(or give --pipeline-layout)")
        counts = [cfg.layers // (cfg.pp * cfg.vpp)] * (cfg.pp * cfg.vpp)
    need(cfg.recompute_layers >= 0,
         f"--recompute-layers must be >= 0, got {cfg.recompute_layers}")
    need(cfg.recompute_layers == 0 or cfg.recompute == "full",
         f"--recompute-layers {cfg.recompute_layers} selects blocks for full recomputation: it "
         f"needs --recompute full (got --recompute {cfg.recompute})")
    if cfg.recompute_layers:
        # Every stage (model chunk) recomputes its first N blocks (Megatron's block method), so
        # N must fit in the smallest one.
        fewest = min(range(len(counts)), key=lambda s: counts[s])
        need(cfg.recompute_layers <= counts[fewest],
             f"--recompute-layers {cfg.recompute_layers} exceeds the {counts[fewest]} layers of "
             f"pipeline stage {fewest} (--layers {cfg.layers}, --pp {cfg.pp}, --vpp {cfg.vpp}"
             f"{', --pipeline-layout ' + cfg.pipeline_layout if cfg.pipeline_layout else ''}): "
             "full recomputation applies to the first N blocks of every stage")
    need(cfg.cp >= 1, f"--cp must be >= 1, got {cfg.cp}")
    if cfg.cp > 1:
        kv_ = cfg.kv_heads or cfg.heads
        need(cfg.seq_len % (2 * cfg.cp) == 0,
             f"--cp {cfg.cp}: --seq-len {cfg.seq_len} must be divisible by 2 x cp = "
             f"{2 * cfg.cp} (the zigzag layout cuts each sequence into 2 x cp chunks)")
        need(not cfg.sequence_parallel or (cfg.seq_len // cfg.cp) % cfg.tp == 0,
             f"--sequence-parallel with --cp {cfg.cp}: --tp {cfg.tp} does not divide each cp "
             f"rank's {cfg.seq_len // cfg.cp} tokens")
        need(cfg.cp_comm != "a2a" or (cfg.heads % (cfg.tp * cfg.cp) == 0 and
                                      kv_ % (cfg.tp * cfg.cp) == 0),
             f"--cp-comm a2a splits heads over tp x cp = {cfg.tp * cfg.cp}: --heads "
             f"{cfg.heads} and the {kv_} key/value heads must be divisible by it (or use "
             "--cp-comm ring)")
        need(cfg.device == "cpu", f"--cp {cfg.cp}: context parallelism runs on the CPU "
             "(MPI) backend for now")
        need(cfg.zero < 2, f"--zero {cfg.zero} with --cp {cfg.cp}: ZeRO-2/3 over the dp x cp "
             "group is not supported yet (use --zero 0 or 1)")
    if cfg.tp > 1:
        kv_ = cfg.kv_heads or cfg.heads
        need(cfg.heads % cfg.tp == 0,
             f"--tp {cfg.tp} does not divide --heads {cfg.heads} (attention splits heads)")
        need(kv_ % cfg.tp == 0, f"--tp {cfg.tp} does not divide the {kv_} key/value heads "
             "(--kv-heads; grouped-query attention splits them too)")
        need(cfg.cp > 1 or not cfg.sequence_parallel or cfg.seq_len % cfg.tp == 0,
             f"--sequence-parallel: --tp {cfg.tp} does not divide --seq-len {cfg.seq_len}")
    validate_moe(cfg, need, dp_size)
    need(cfg.ddp_bucket_mb > 0, f"--ddp-bucket-mb must be > 0, got {cfg.ddp_bucket_mb}")
    need(cfg.ranks_per_node >= 0, f"--ranks-per-node must be >= 0 (0: from the environment), "
         f"got {cfg.ranks_per_node}")
    need(cfg.fp8_amax_history >= 0, f"--fp8-amax-history must be >= 0, got "
         f"{cfg.fp8_amax_history}")
    need(math.isfinite(cfg.fp8_margin) and cfg.fp8_margin >= 0,
         f"--fp8-margin must be >= 0, got {cfg.fp8_margin}")
    validate_precision(cfg, need)
    need(cfg.powersgd_rank >= 1, f"--powersgd-rank must be >= 1, got {cfg.powersgd_rank}")
    need(0 < cfg.topk_ratio <= 1, f"--topk-ratio must be in (0, 1], got {cfg.topk_ratio}")
    need(cfg.compression_start_step >= 0,
         f"--compression-start-step must be >= 0, got {cfg.compression_start_step}")
    need(cfg.compression_start_step == 0 or cfg.grad_compression != "none",
         "--compression-start-step applies to --grad-compression")
    need(cfg.grad_compression == "none" or cfg.zero < 2,
         f"--grad-compression {cfg.grad_compression} with --zero {cfg.zero}: compression works "
         "with all-reduced (--zero 0) and ZeRO-1 gradients, not ZeRO-2/3 shards")
    need(cfg.ranks_per_node == 0 or cfg.hierarchical_reduce,
         "--ranks-per-node applies to --hierarchical-reduce")
    need(cfg.log_interval > 0, f"--log-interval must be > 0, got {cfg.log_interval}")
    need(cfg.trace == "" or cfg.pp > 1, "--trace records the pipeline timeline: it needs --pp > 1")
    need(cfg.d_model % cfg.heads == 0,
         f"--heads {cfg.heads} does not divide --d-model {cfg.d_model}")
    kv = cfg.kv_heads or cfg.heads
    need(cfg.heads % kv == 0, f"--kv-heads {kv} does not divide --heads {cfg.heads}")
    need(cfg.arch == "llama" or kv == cfg.heads,
         f"--kv-heads {cfg.kv_heads}: grouped-query attention needs --arch llama")
    need(0.0 <= cfg.dropout < 1.0, f"--dropout must be in [0, 1), got {cfg.dropout}")
    need(cfg.lr > 0, f"--lr must be > 0, got {cfg.lr}")
    need(cfg.min_lr_value <= cfg.lr, f"--min-lr {cfg.min_lr} is larger than --lr {cfg.lr}")
    need(cfg.warmup_steps <= cfg.steps,
         f"--warmup-steps {cfg.warmup_steps} exceeds --steps {cfg.steps}")
    need(cfg.weight_decay >= 0, f"--weight-decay must be >= 0, got {cfg.weight_decay}")
    need(0 <= cfg.beta1 < 1 and 0 <= cfg.beta2 < 1,
         f"--beta1/--beta2 must be in [0, 1), got {cfg.beta1}, {cfg.beta2}")
    need(cfg.clip_grad >= 0, f"--clip-grad must be >= 0, got {cfg.clip_grad}")
    need(math.isfinite(cfg.initial_loss_scale) and cfg.initial_loss_scale > 0,
         f"--initial-loss-scale must be a positive number, got {cfg.initial_loss_scale}")
    need(cfg.loss_scale_window >= 1,
         f"--loss-scale-window must be >= 1, got {cfg.loss_scale_window}")
    try:
        injected = inject_steps(cfg)
    except ValueError:
        injected = None
    need(injected is not None and all(s >= 1 for s in injected),
         f"--inject-nonfinite-grad must list step numbers >= 1 separated by commas, got "
         f"{cfg.inject_nonfinite_grad!r}")
    try:
        injected = inject_loss_steps(cfg)
    except ValueError:
        injected = None
    need(injected is not None and all(s >= 1 for s, _ in injected),
         f"--inject-nonfinite-loss must list STEP or STEP@RANK (steps >= 1, ranks >= 0) "
         f"separated by commas, got {cfg.inject_nonfinite_loss!r}")
    need(cfg.max_skipped_steps >= 1,
         f"--max-skipped-steps must be >= 1, got {cfg.max_skipped_steps}")
    need(math.isfinite(cfg.straggler_threshold) and
         (cfg.straggler_threshold == 0 or cfg.straggler_threshold >= 1),
         f"--straggler-threshold must be 0 (off) or a ratio >= 1, got "
         f"{cfg.straggler_threshold}")
    gbs = cfg.global_batch_size or cfg.micro_batch_size * dp_size
    need(gbs % (cfg.micro_batch_size * dp_size) == 0,
         f"--global-batch-size {gbs} is not a multiple of --micro-batch-size "
         f"{cfg.micro_batch_size} x data-parallel size {dp_size}")
    if cfg.pp > 1 and gbs % (cfg.micro_batch_size * dp_size) == 0:
        m = gbs // (cfg.micro_batch_size * dp_size)
        need(cfg.schedule != "interleaved" or (m >= cfg.pp and m % cfg.pp == 0),
             f"--schedule interleaved: the {m} micro-batches per step (global batch / (micro "
             f"batch x dp)) must be a multiple of --pp {cfg.pp} and at least {cfg.pp}")
    need(bool(cfg.data) != cfg.synthetic_data,
         "give exactly one data source: --data PREFIX or --synthetic-data"
         if not cfg.data else "--data and --synthetic-data exclude each other")
    if cfg.synthetic_data:
        need(cfg.vocab_size > 0, "--synthetic-data needs --vocab-size")
    else:
        for ext in (".idx", ".bin"):
            need(os.path.isfile(cfg.data + ext),
                 f"--data {cfg.data}: {cfg.data + ext} not found (make it with "
                 "python -m tardelli.data.preprocess)")
    try:
        ratios = [float(x) for x in cfg.split.split(",")]
    except ValueError:
        ratios = []
    need(len(ratios) == 3 and all(r >= 0 for r in ratios) and ratios[0] > 0,
         f"--split must be three non-negative ratios with train > 0, e.g. 98,1,1; got "
         f"{cfg.split!r}")
    need(not cfg.resume or cfg.save, "--resume needs --save DIR (where the checkpoints are)")
    need(not cfg.async_save or cfg.save, "--async-save needs --save DIR")


def validate_moe(cfg, need, dp_size=1):
    """The mixture-of-experts keys (checked whatever --num-experts, so a typo in a dense run's
    MoE key is caught too), --ep, and the layouts the MoE model does not support yet."""
    need(cfg.num_experts >= 0, f"--num-experts must be >= 0 (0: dense), got {cfg.num_experts}")
    for name in ("moe_ffn_hidden", "moe_shared_experts"):
        need(getattr(cfg, name) >= 0, f"--{name.replace('_', '-')} must be >= 0, "
             f"got {getattr(cfg, name)}")
    need(cfg.moe_layer_freq >= 1, f"--moe-layer-freq must be >= 1, got {cfg.moe_layer_freq}")
    for name in ("moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_bias_update_rate",
                 "moe_capacity_factor"):
        v = getattr(cfg, name)
        need(math.isfinite(v) and v >= 0,
             f"--{name.replace('_', '-')} must be a number >= 0, got {v}")
    need(cfg.ep >= 1, f"--ep must be >= 1, got {cfg.ep}")
    need(cfg.ep == 1 or cfg.num_experts > 0,
         f"--ep {cfg.ep}: expert parallelism needs a mixture-of-experts model (--num-experts)")
    if cfg.num_experts == 0:
        return
    need(1 <= cfg.moe_top_k <= cfg.num_experts,
         f"--moe-top-k {cfg.moe_top_k} must be in [1, --num-experts {cfg.num_experts}]")
    need(cfg.num_experts % cfg.ep == 0,
         f"--num-experts {cfg.num_experts} is not divisible by --ep {cfg.ep} (each ep rank "
         "holds num_experts / ep experts)")
    need(dp_size % cfg.ep == 0,
         f"--ep {cfg.ep} does not divide the data-parallel size {dp_size} (ranks / (tp x cp x "
         "pp)): the ep ranks are data-parallel ranks of the dense layers")
    need(cfg.ep == 1 or cfg.zero < 3,
         f"--ep {cfg.ep} with --zero 3: sharding the experts over their expert-data-parallel "
         "group is not supported yet (use --zero 0, 1 or 2)")
    need(not cfg.sequence_parallel,
         f"--num-experts {cfg.num_experts} with --sequence-parallel: the MoE layers run on "
         "whole sequences under --tp (drop --sequence-parallel)")
    need(cfg.cp == 1, f"--num-experts {cfg.num_experts} with --cp {cfg.cp}: the MoE layers do "
         "not support context parallelism yet (use --cp 1)")


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
def _flatten(table, prefix=""):
    """{"h": {"3": {"mlp": {"c_fc": "bf16"}}}} -> {"h.3.mlp.c_fc": "bf16"}: TOML reads dotted
    keys as nested tables, JSON may hold either form."""
    out = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out


def read_precision_map(path, n_layer):
    """The --precision-map file (JSON, or TOML by its .toml suffix) as {linear name: precision},
    checked against a model of n_layer blocks; ConfigError naming the file and the entry."""
    import json
    try:
        with open(path, "rb") as f:
            raw = f.read()
        table = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--precision-map {path}: {e}") from None
    if not isinstance(table, dict):
        raise ConfigError(f"--precision-map {path}: expected a table of linear names to "
                          f"precisions, got {type(table).__name__}")
    entries = _flatten(table)
    for k, v in entries.items():
        if not isinstance(v, str):
            raise ConfigError(f"--precision-map {path}: entry '{k}': expected a precision "
                              f"string (fp8, bf16 or fp32), got {v!r}")
    from .. import _C  # the C++ core, only when a map is given
    try:
        return _C.models.parse_precision_map(entries, n_layer)
    except Exception as e:  # td::Error: names the entry
        raise ConfigError(f"--precision-map {path}: {e}") from None


RESUME_KEYS = ("seq_len", "data", "split", "synthetic_data", "seed")
