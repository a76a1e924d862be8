"""How well the planner predicts: runs the planner's top-K layouts and a few random valid ones of
two small models with `python -m tardelli.launch ... -m tardelli.train`, and compares predicted
with measured step time and peak memory (the summary's `peak_mem_bytes_max_rank`).

    PYTHONPATH=python .venv/bin/python benchmarks/plan_accuracy.py --profile machine.json \\
        [--nprocs 1,2,4] [--top 3] [--random 2] [--steps 8]

One JSON line per run (flags, predicted and measured step ms and peak bytes, relative errors),
then one summary line: step-time mean absolute relative error, peak-memory errors, and for each
(model, nproc) how much slower the planner's pick measured than the fastest measured layout.
Measured step time: the median over the steps after the first two (warm-up), from the metrics
file's tokens_per_s. Docs: docs/planner.md, "Accuracy on this machine".
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

MODELS = {
    "gpt2-4x256": ["--arch", "gpt2", "--layers", "4", "--d-model", "256", "--heads", "8",
                   "--seq-len", "128", "--vocab-size", "4096"],
    "llama-4x192": ["--arch", "llama", "--layers", "4", "--d-model", "192", "--heads", "6",
                    "--kv-heads", "2", "--seq-len", "256", "--vocab-size", "2048"],
}
GLOBAL_BATCH = 8


def model_config(flags, gbs):
    from tardelli.train import config as C
    args = C.build_parser().parse_args(flags + ["--synthetic-data", "--global-batch-size",
                                                str(gbs)])
    return C.TrainConfig(**{k: getattr(args, k) for k in C._FIELDS
                            if getattr(args, k) is not None})


def measure(model_flags, layout_flags, nproc, gbs, steps, timeout=600):
    """(median step seconds, peak_mem_bytes_max_rank) of a real run."""
    with tempfile.TemporaryDirectory() as d:
        mf = os.path.join(d, "metrics.jsonl")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        env.pop("OMP_NUM_THREADS", None)  # the launcher's default: cores // nproc
        pre = [sys.executable] if nproc == 1 else \
            [sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc)]
        cmd = pre + ["-m", "tardelli.train", "--synthetic-data", *model_flags,
                     *layout_flags.split(), "--global-batch-size", str(gbs), "--steps",
                     str(steps), "--eval-interval", "0", "--no-progress", "--log-interval",
                     "1000", "--metrics-file", mf]
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        summary = None
        for line in p.stdout.splitlines():
            if line.startswith("{") and '"train_end"' in line:
                summary = json.loads(line)
        rows = [json.loads(x) for x in open(mf)]
        seq = int(model_flags[model_flags.index("--seq-len") + 1])
        dts = [gbs * seq / r["tokens_per_s"] for r in rows[2:]]
        return statistics.median(dts), summary["peak_mem_bytes_max_rank"]


def measure_cpu(model_flags, layout_flags, gbs, steps):
    """One process, one OpenMP thread, timed in CPU seconds (Note [CPU clock] in
    python/tardelli/plan/calibrate.py): (CPU seconds per step: a `steps`-step run less a 2-step
    run, over steps - 2; peak_mem_bytes_max_rank of the longer run)."""
    from tardelli.plan.calibrate import child_cpu_seconds
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    cpu, peak = {}, None
    for n in (2, steps):
        cmd = [sys.executable, "-m", "tardelli.train", "--synthetic-data", *model_flags,
               *layout_flags.split(), "--global-batch-size", str(gbs), "--steps", str(n),
               "--eval-interval", "0", "--no-progress", "--log-interval", "1000"]
        p, cpu[n] = child_cpu_seconds(cmd, env, cwd=ROOT)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
        for line in p.stdout.splitlines():
            if line.startswith("{") and '"train_end"' in line:
                peak = json.loads(line)["peak_mem_bytes_max_rank"]
    return (cpu[steps] - cpu[2]) / (steps - 2), peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--nprocs", default="1,2,4")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--random", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: one process with one thread, steps timed in CPU seconds (for a "
                    "machine shared with other jobs; needs a calibrate --clock cpu profile)")
    ap.add_argument("--rescore", help="recompute the predictions for the runs recorded in this "
                    "file (an earlier output of this script) instead of running anything")
    a = ap.parse_args()
    from tardelli import plan as P
    machine = P.machine_from(a.profile)
    if a.rescore:
        results, picks = rescore(a.rescore, machine)
        print(json.dumps(dict(summarize(results, picks, None, time.time()), rescored=a.rescore)))
        return
    rng = random.Random(a.seed)
    results, picks = [], []
    load0 = open("/proc/loadavg").read().split()[:3]
    t0 = time.time()
    if a.clock == "cpu":
        a.nprocs = "1"
    for name in a.models.split(","):
        mflags = MODELS[name]
        cfg = model_config(mflags, GLOBAL_BATCH)
        for nproc in (int(x) for x in a.nprocs.split(",")):
            rows = P.plan(cfg, nproc, machine, GLOBAL_BATCH)
            chosen = rows[:a.top]
            rest = rows[a.top:]
            chosen += rng.sample(rest, min(a.random, len(rest)))
            measured = []
            for i, r in enumerate(chosen):
                try:
                    if a.clock == "cpu":
                        sec, peak = measure_cpu(mflags, r["flags"], GLOBAL_BATCH, a.steps)
                    else:
                        sec, peak = measure(mflags, r["flags"], nproc, GLOBAL_BATCH, a.steps)
                except RuntimeError as e:
                    print(json.dumps({"model": name, "nproc": nproc, "flags": r["flags"],
                                      "error": str(e)[-500:]}), flush=True)
                    continue
                rec = {"model": name, "nproc": nproc, "rank": rows.index(r) + 1,
                       "flags": r["flags"], "pred_ms": r["step_ms"],
                       "meas_ms": round(sec * 1e3, 3),
                       "time_err": round((r["step_ms"] - sec * 1e3) / (sec * 1e3), 4),
                       "pred_mem": r["peak_mem_bytes"], "meas_mem": peak,
                       "mem_err": round((r["peak_mem_bytes"] - peak) / peak, 4)}
                results.append(rec)
                measured.append(rec)
                print(json.dumps(rec), flush=True)
            if measured and measured[0]["rank"] == 1:
                fastest = min(m["meas_ms"] for m in measured)
                picks.append({"model": name, "nproc": nproc, "flags": measured[0]["flags"],
                              "pick_over_fastest": round(measured[0]["meas_ms"] / fastest - 1,
                                                         4)})
    print(json.dumps(summarize(results, picks, load0, t0)), flush=True)


def summarize(results, picks, load0, t0):
    from tardelli.plan import calibrate
    te = [abs(r["time_err"]) for r in results]
    me = [abs(r["mem_err"]) for r in results]
    return {
        "summary": True, "cpu": calibrate.cpu_name(), "runs": len(results),
        "loadavg_before": load0, "loadavg_after": open("/proc/loadavg").read().split()[:3],
        "seconds": round(time.time() - t0), "step_time_mae": round(statistics.mean(te), 4)
        if te else None, "step_time_max_err": round(max(te), 4) if te else None,
        "mem_mean_abs_err": round(statistics.mean(me), 4) if me else None,
        "mem_max_abs_err": round(max(me), 4) if me else None, "picks": picks}


def rescore(path, machine):
    """Predictions of the current model for the runs recorded in `path` (this script's output):
    the measured figures stay, the predicted ones and the errors are recomputed, and the
    planner's pick is the layout the current model ranks first among those measured."""
    from tardelli import plan as P
    runs = [json.loads(x) for x in open(path) if x.startswith('{"model"') and '"error"' not in x]
    out, picks = [], []
    groups = {}
    for r in runs:
        cfg = model_config(MODELS[r["model"]], GLOBAL_BATCH)
        spec = P.ModelSpec.from_config(cfg)
        p = P.evaluate(spec, P._parse_flags(r["flags"], r["nproc"]), GLOBAL_BATCH, machine,
                       r["nproc"])
        r = dict(r, pred_ms=p["step_ms"], pred_mem=p["peak_mem_bytes"],
                 time_err=round((p["step_ms"] - r["meas_ms"]) / r["meas_ms"], 4),
                 mem_err=round((p["peak_mem_bytes"] - r["meas_mem"]) / r["meas_mem"], 4))
        out.append(r)
        groups.setdefault((r["model"], r["nproc"]), []).append(r)
        print(json.dumps(r), flush=True)
    for (name, nproc), rs in groups.items():
        pick = min(rs, key=lambda r: r["pred_ms"])
        fastest = min(r["meas_ms"] for r in rs)
        picks.append({"model": name, "nproc": nproc, "flags": pick["flags"],
                      "pick_over_fastest": round(pick["meas_ms"] / fastest - 1, 4)})
    return out, picks


if __name__ == "__main__":
    main()
