"""tardelli.plan: the automatic parallel-layout planner (docs/planner.md).

    python -m tardelli.plan calibrate --out machine.json          # profile this machine
    python -m tardelli.plan --layers 8 --d-model 256 --heads 8 --seq-len 256 --vocab-size 4096 \\
        --nproc 4 --global-batch-size 16 --profile machine.json --json    # best layout first

The model flags are the train CLI's (`python -m tardelli.train --help`); a TOML --config works
too. Each printed line is {"flags", "step_ms", "peak_mem_bytes", "breakdown"}; `flags` are the
train CLI flags of that layout. `python -m tardelli.train --plan auto ...` trains with the first.
"""
import argparse
import json
import os
import sys

from .layout import Layout, ModelSpec  # noqa: F401
from .profile import Machine, ProfileError, load as load_profile  # noqa: F401
from .search import PlanError, evaluate, layouts, plan  # noqa: F401

DEFAULT_PROFILE_ENV = "TD_PLAN_PROFILE"


def default_profile_path():
    """$TD_PLAN_PROFILE, else ~/.cache/tardelli/profile.json (where calibrate writes by
    default)."""
    return os.environ.get(DEFAULT_PROFILE_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "tardelli", "profile.json")


def machine_from(path):
    path = path or default_profile_path()
    if not os.path.exists(path):
        raise ProfileError(f"no machine profile at {path}: run `python -m tardelli.plan "
                           f"calibrate --out {path}` first (or pass --profile FILE)")
    return Machine(load_profile(path))


def best_layout(cfg, nproc, profile_path=None):
    """(Layout-applied TrainConfig, prediction) of the fastest layout of cfg's model on nproc
    ranks that fits the profile's memory: what `tardelli.train --plan auto` runs."""
    from .search import plan as _plan
    gbs = cfg.global_batch_size or cfg.micro_batch_size * nproc
    rows = _plan(cfg, nproc, machine_from(profile_path), gbs)
    top = rows[0]
    lay = _parse_flags(top["flags"], nproc)
    return lay.apply(cfg, gbs), top


def _parse_flags(flags, nproc):
    toks = flags.split()
    kv, i = {}, 0
    while i < len(toks):
        k = toks[i][2:].replace("-", "_")
        if i + 1 < len(toks) and not toks[i + 1].startswith("--"):
            kv[k] = toks[i + 1]
            i += 2
        else:
            kv[k] = True
            i += 1
    tp, pp, cp = int(kv["tp"]), int(kv["pp"]), int(kv["cp"])
    return Layout(tp=tp, pp=pp, vpp=int(kv.get("vpp", 1)), dp=nproc // (tp * pp * cp), cp=cp,
                  ep=int(kv.get("ep", 1)), sequence_parallel=bool(kv.get("sequence_parallel")),
                  micro_batch_size=int(kv["micro_batch_size"]), zero=int(kv["zero"]),
                  recompute=kv["recompute"], schedule=kv.get("schedule", "1f1b"),
                  cp_comm=kv.get("cp_comm", "ring"))


def _extra(p):
    g = p.add_argument_group("planner")
    g.add_argument("--nproc", type=int, required=True, help="ranks of the job")
    g.add_argument("--profile", help="machine profile JSON (python -m tardelli.plan "
                   f"calibrate; default ${DEFAULT_PROFILE_ENV} or ~/.cache/tardelli/profile.json)")
    g.add_argument("--mem-limit", type=float, help="bytes per rank (default: the profile's "
                   "memory_bytes)")
    g.add_argument("--json", action="store_true", help="one JSON object per line, best first")
    g.add_argument("--top", type=int, default=0, help="print only the best N (0: all)")


def _search_main(argv):
    from ..train import config as C
    parser = C.build_parser(prog="python -m tardelli.plan", extra=_extra)
    parser.description = ("Rank every valid parallel layout of a GPT on N ranks by predicted "
                          "step time (docs/planner.md). Model flags as python -m tardelli.train.")
    args = parser.parse_args(argv)
    values = {}
    if args.config:
        values.update(C.load_toml(args.config))
    for name in C._FIELDS:
        v = getattr(args, name)
        if v is not None:
            values[name] = v
    if not values.get("data"):
        values["synthetic_data"] = True  # planning reads no data
    cfg = C.TrainConfig(**values)
    rows = plan(cfg, args.nproc, machine_from(args.profile), None,
                int(args.mem_limit) if args.mem_limit is not None else None)
    if args.top:
        rows = rows[:args.top]
    for r in rows:
        if args.json:
            print(json.dumps(r))
        else:
            mem = r["peak_mem_bytes"] / 2 ** 20
            print(f"{r['step_ms']:10.2f} ms  {mem:10.1f} MiB  {r['flags']}")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    from ..train.config import ConfigError
    try:
        if argv[:1] == ["_worker"]:
            from . import calibrate as cal
            if argv[1] == "compute":
                cal.worker_compute(int(argv[2]))
            else:
                cal.worker_comm()
            return 0
        if argv[:1] == ["megatron"]:
            from . import megatron
            return megatron.main(argv[1:])
        if argv[:1] == ["calibrate"]:
            from . import calibrate as cal
            ap = argparse.ArgumentParser(prog="python -m tardelli.plan calibrate",
                                         description="Measure this machine for the planner.")
            ap.add_argument("--out", default=default_profile_path(), help="profile JSON to write")
            ap.add_argument("--nproc", default="1,2,4",
                            help="world sizes to calibrate for (comma-separated)")
            ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                            help="cpu: a one-core profile timed in CPU seconds, comparable "
                            "under load with plan_accuracy.py --clock cpu (Note [CPU clock])")
            a = ap.parse_args(argv[1:])
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            cal.calibrate(a.out, tuple(int(x) for x in a.nproc.split(",")), clock=a.clock)
            return 0
        return _search_main(argv)
    except (ProfileError, PlanError, ConfigError) as e:
        print(f"python -m tardelli.plan: error: {e}", file=sys.stderr)
        return 2


__all__ = ["Layout", "Machine", "ModelSpec", "PlanError", "ProfileError", "best_layout",
           "evaluate", "layouts", "load_profile", "machine_from", "main", "plan"]
