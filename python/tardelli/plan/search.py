"""Enumerates every layout the trainer accepts for a model on N ranks, predicts each one's step
time and peak memory, drops those over the memory limit and ranks the rest (fastest first)."""
import functools
import itertools

from .cost import StepModel
from .layout import Layout, ModelSpec, check, divisors, microbatches
from .memory import peak_memory


class PlanError(ValueError):
    """A planning request that cannot be served (no valid layout, a bad world size)."""


@functools.lru_cache(maxsize=4096)
def _simulate(kind, stages, m, chunks, tf, tbi, tbw):
    from ..distributed import pipeline as P
    return P.simulate(P.make_schedule(kind, stages, m, chunks), tf, tbi, tbw)


def _in_flight(layout, m):
    if layout.pp == 1:
        return None
    return _simulate(layout.schedule, layout.pp, m, layout.vpp, 1.0, 1.0, 1.0).timeline


def evaluate(spec, layout, gbs, machine, nproc=None):
    """The prediction for one layout: {"flags", "step_ms", "peak_mem_bytes", "breakdown"}."""
    model = StepModel(spec, machine, nproc or layout.world)
    sec, bd = model.step(layout, gbs, _simulate)
    m = microbatches(layout, gbs)
    peak, mem = peak_memory(spec, layout, gbs, machine.p["allocator"], _in_flight(layout, m))
    slack = machine.p.get("memory_slack", 0.0)
    peak = int(peak * (1 + slack))
    bd = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in bd.items()}
    bd["memory"] = mem
    return {"flags": layout.flags(), "step_ms": round(sec * 1e3, 4), "peak_mem_bytes": peak,
            "breakdown": bd}


def layouts(cfg, nproc, gbs):
    """Every Layout for `nproc` ranks that tardelli.train.config.validate accepts for the model
    and global batch of `cfg` (yields (layout, None); the rejected ones are not yielded)."""
    moe = cfg.num_experts > 0
    for tp in divisors(nproc):
        for cp in divisors(nproc // tp):
            for pp in divisors(nproc // (tp * cp)):
                dp = nproc // (tp * cp * pp)
                if gbs % dp:
                    continue
                eps = [e for e in divisors(dp)] if moe else [1]
                scheds = ["1f1b"] if pp == 1 else ["gpipe", "1f1b", "interleaved", "zb"]
                for ep, sched in itertools.product(eps, scheds):
                    vpps = [1] if sched != "interleaved" else \
                        [v for v in range(2, cfg.layers // pp + 1) if cfg.layers % (pp * v) == 0]
                    for vpp in vpps:
                        for mb in divisors(gbs // dp):
                            for zero, rec, sp, cpc in itertools.product(
                                    (0, 1, 2, 3), ("none", "selective", "full"),
                                    (False, True) if tp > 1 else (False,),
                                    ("ring", "a2a") if cp > 1 else ("ring",)):
                                if dp * cp == 1 and zero:
                                    continue  # nothing to shard over
                                lay = Layout(tp, pp, vpp, dp, cp, ep, sp, mb, zero, rec, sched,
                                             cpc)
                                if check(lay, cfg, gbs) is None:
                                    yield lay


def plan(cfg, nproc, machine, gbs=None, mem_limit=None):
    """Predictions for every valid layout within the memory limit, fastest first. Raises
    PlanError when no layout fits, naming why."""
    if nproc < 1:
        raise PlanError(f"--nproc must be >= 1, got {nproc}")
    gbs = gbs or cfg.global_batch_size or cfg.micro_batch_size * nproc
    spec = ModelSpec.from_config(cfg)
    limit = mem_limit if mem_limit is not None else machine.p["memory_bytes"]
    out, n_valid, smallest = [], 0, None
    for lay in layouts(cfg, nproc, gbs):
        n_valid += 1
        r = evaluate(spec, lay, gbs, machine, nproc)
        if smallest is None or r["peak_mem_bytes"] < smallest:
            smallest = r["peak_mem_bytes"]
        if r["peak_mem_bytes"] <= limit:
            out.append(r)
    if n_valid == 0:
        raise PlanError(
            f"no valid layout of this model on {nproc} ranks at global batch {gbs}: every "
            f"split of {nproc} into tp x cp x pp x dp breaks a rule of the trainer (heads "
            f"{cfg.heads} and kv heads divisible by tp, layers {cfg.layers} by pp x vpp, the "
            f"global batch by micro batch x dp, seq_len {cfg.seq_len} by 2 x cp, ...)")
    if not out:
        raise PlanError(f"none of the {n_valid} valid layouts fits in {limit} bytes per rank "
                        f"(the smallest needs {smallest}); raise --mem-limit or use more ranks")
    out.sort(key=lambda r: (r["step_ms"], r["peak_mem_bytes"]))
    return out
