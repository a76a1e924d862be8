#!/usr/bin/env python3
"""Step time of tardelli-train against python -m tardelli.train at the same layout: two front
ends of the same C++ loop (Note [C++ training loop] in include/tardelli/train/trainer.h), so
the difference is the Python front end's cost (its per-step callbacks through the binding, the
interpreter beside the loop); issue 28's target is the Python front end within 2% of the C++
one.

    PYTHONPATH=python .venv/bin/python benchmarks/train_loop_overhead.py [--binary build/ci/tardelli-train]

For each layout both front ends train the same model on the same synthetic data for --steps
steps, alternating (python, C++, python, C++, ...) --repeats times so that drift in the
machine's load falls on both alike. A run's step time is the median over its steps after the
first --warmup (from the metrics rows: global batch x seq_len / tokens_per_s, the step's wall
time without evaluation or logging). Output: one JSON line per layout with both medians (of the
per-run medians), the ratio python / C++ and whether it is within the 2% target, then a summary
line. Each step is also checked to give the same loss on both (the same loop on the same
configuration), so a timing never compares different work.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from tardelli.plan.calibrate import cpu_name  # noqa: E402

LAYOUTS = {
    "1 rank": (1, []),
    "dp 2": (2, []),
    "tp 2 + sp": (2, ["--tp", "2", "--sequence-parallel"]),
    "pp 2 1f1b": (2, ["--pp", "2", "--global-batch-size", "16"]),
}


def run(nproc, cmd, metrics, env):
    prefix = [sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc)] if nproc > 1 else []
    p = subprocess.run(prefix + cmd + ["--metrics-file", str(metrics)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"train_loop_overhead: {' '.join(cmd[:3])} failed:\n{p.stderr[-2000:]}")
    return [json.loads(line) for line in open(metrics)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=None, help="tardelli-train (default: build/ci, build/cpu)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated names")
    args = ap.parse_args()
    binary = args.binary or next((str(ROOT / d / "tardelli-train") for d in
                                  ("build/ci", "build/cpu") if (ROOT / d / "tardelli-train")
                                  .is_file()), None)
    if binary is None:
        raise SystemExit("train_loop_overhead: no tardelli-train built; give --binary")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    model = ["--synthetic-data", "--vocab-size", "2048", "--layers", "4", "--d-model", "256",
             "--heads", "8", "--seq-len", "128", "--micro-batch-size", "4",
             "--steps", str(args.steps), "--eval-interval", "0", "--no-progress",
             "--log-interval", str(10 ** 6)]
    results = []
    with tempfile.TemporaryDirectory() as d:
        for name in args.layouts.split(","):
            nproc, extra = LAYOUTS[name]
            times = {"python": [], "cpp": []}
            for rep in range(args.repeats):
                rows = {}
                for front, cmd in (("python", [sys.executable, "-m", "tardelli.train"]),
                                   ("cpp", [binary])):
                    m = Path(d) / f"{front}{rep}.jsonl"
                    r = run(nproc, cmd + model + extra, m, env)
                    rows[front] = r
                    # tokens_per_s = global batch x seq_len / step seconds: seconds per token
                    # are proportional to the step time (the same tokens on both front ends).
                    steps = [1.0 / row["tokens_per_s"] for row in r[args.warmup:]]
                    times[front].append(statistics.median(steps))
                same = [a["loss"] for a in rows["python"]] == [b["loss"] for b in rows["cpp"]]
                if not same:
                    raise SystemExit(f"train_loop_overhead: {name}: the two front ends' losses "
                                     "differ; the timing would compare different work")
            py, cpp = statistics.median(times["python"]), statistics.median(times["cpp"])
            rec = {"layout": name, "ranks": nproc,
                   "python_s_per_token": py, "cpp_s_per_token": cpp,
                   "python_over_cpp": py / cpp, "target_ratio": 1.02,
                   "within_target": py / cpp <= 1.02, "per_run_python": times["python"],
                   "per_run_cpp": times["cpp"]}
            print(json.dumps(rec), flush=True)
            results.append(rec)
    print(json.dumps({"summary": "train_loop_overhead", "cpu": cpu_name(),
                      "load_average": os.getloadavg()[0],
                      "worst_python_over_cpp": max(r["python_over_cpp"] for r in results),
                      "all_within_target": all(r["within_target"] for r in results)}))


if __name__ == "__main__":
    main()
