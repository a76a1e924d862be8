"""The front end of `python -m tardelli.train` over the C++ training loop.

The loop itself (layout, model, DDP/ZeRO, optimizer, data, every step, evaluation, metrics rows,
checkpoints, supervised restarts) is td::train::Trainer (include/tardelli/train/trainer.h),
the same one `tardelli-train` and custom C++ trainers run; this module hands it the parsed
configuration (config.py, after --plan auto has chosen the layout) and keeps what belongs to a
Python front end: the progress bar, the loss-curve and pipeline-timeline PNGs (matplotlib),
and the summary line.
"""
import dataclasses
import json
import os

import tardelli as td

from .. import _C
from . import report


def model_config(cfg, vocab_size):
    """The td.models.GPTConfig the trainer builds for `cfg` (and a data vocabulary)."""
    return td.models.GPTConfig(
        arch=cfg.arch, vocab_size=vocab_size, block_size=cfg.seq_len, n_layer=cfg.layers,
        n_head=cfg.heads, n_kv_head=cfg.kv_heads, d_model=cfg.d_model,
        ffn_hidden=cfg.ffn_hidden, dropout=cfg.dropout, dtype=cfg.dtype, seed=cfg.seed,
        num_experts=cfg.num_experts, moe_top_k=cfg.moe_top_k, moe_ffn_hidden=cfg.moe_ffn_hidden,
        moe_layer_freq=cfg.moe_layer_freq, moe_shared_experts=cfg.moe_shared_experts,
        moe_aux_loss_coeff=cfg.moe_aux_loss_coeff, moe_z_loss_coeff=cfg.moe_z_loss_coeff,
        moe_router_bias_update_rate=cfg.moe_router_bias_update_rate,
        moe_capacity_factor=cfg.moe_capacity_factor)


def gemm_peak_flops(dtype, device="cpu", n=None, reps=5):
    """The best GEMM rate of this library on this machine for `dtype` (FLOP/s): the
    denominator of MFU (td::train::gemm_peak_flops: 1024^3 on the CPU, 4096^3 on a GPU)."""
    name = {td.float32: "fp32", td.bfloat16: "bf16", td.float16: "fp16"}.get(dtype, dtype)
    return _C.train.gemm_peak_flops(name, str(device), n or 0, reps)


def join_world():
    """The world communicator when this process was started as one rank of several (by
    `python -m tardelli.launch`, mpirun or srun), else None (a single process needs no MPI)."""
    size = None
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            size = int(os.environ[name])
            break
    if not size or size == 1:
        return None
    from .. import distributed as dist
    return dist.world() if dist.is_initialized() else dist.init()


def _config_dict(cfg):
    # --plan auto has already set the layout fields (config.parse_config); the C++ loop takes
    # the result, so the checkpoint's flags record the layout that ran.
    return dataclasses.replace(cfg, plan="").to_dict()


def build(cfg, world=None, checkpoint_vocab=None, tokenizer_dir=""):
    """The C++ Trainer of `cfg` on the ranks of `world` (None: one process, or a world of one
    joined here when a parallel feature needs communicators); a bad configuration raises
    config.ConfigError (the loop's own type). `checkpoint_vocab`: build only to hold a
    checkpoint (no data read; td::train::CheckpointOnly)."""
    if world is None and (cfg.zero or cfg.tp > 1 or cfg.pp > 1 or cfg.cp > 1 or cfg.ep > 1):
        from .. import distributed as dist
        world = dist.world() if dist.is_initialized() else dist.init()  # a world of one
    return _C.train.Trainer(_config_dict(cfg), world, checkpoint_vocab, tokenizer_dir)


def _draw_timeline(cfg, trainer, summary):
    """The pipeline timeline PNG beside --trace's Chrome trace (rank 0, matplotlib only)."""
    from ..distributed import pipeline as sched
    if not sched.have_matplotlib():
        return
    png = os.path.splitext(cfg.trace)[0] + ".png"
    sched.plot_timeline(png, trainer.last_timelines, f"{cfg.schedule}, pp {cfg.pp}, "
                        f"{summary['microbatches']} micro-batches")
    summary["trace_png"] = png


def train(cfg, world=None, out=print):
    """Runs one training job; returns the summary dict (also printed as the last line on rank
    0). `world`: the communicator of a multi-rank job (join_world()), None for one process."""
    trainer = build(cfg, world)
    main = trainer.is_main
    progress = report.Progress(cfg.steps, trainer.step, cfg.progress and main)

    def log(line):
        (progress.write if progress.active else out)(line)

    try:
        summary = json.loads(trainer.run(log, lambda step, loss: progress.update(loss)))
    finally:
        progress.close()
    if main and cfg.trace and "trace" in summary:
        _draw_timeline(cfg, trainer, summary)
    if main and cfg.metrics_file:
        png = os.path.join(cfg.save, "loss.png") if cfg.save else \
            os.path.splitext(cfg.metrics_file)[0] + ".png"
        drawn, why = report.plot_loss_isolated(cfg.metrics_file, png,
                                               f"{cfg.arch} {trainer.num_parameters / 1e6:.1f}M")
        if drawn:
            summary["loss_curve"] = png
        elif "not installed" not in why:
            out(f"train: {why}")
    if main:
        out(json.dumps(summary))
    return summary
