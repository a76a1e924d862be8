#!/usr/bin/env python3
"""How long a checkpoint save blocks training, synchronous vs --async-save, and how long a
supervised restart takes (docs/checkpoints.md, docs/distributed.md).

    PYTHONPATH=python .venv/bin/python benchmarks/checkpoint_save.py
    PYTHONPATH=python .venv/bin/python benchmarks/checkpoint_save.py --d-model 768 --layers 8

Save: `python -m tardelli.train` (one process, synthetic data) saving every --save-interval
steps (enough steps for a background write to finish before the next save, as in real runs
that save every few minutes); the metrics row of a saving step carries save_blocked_s, the time
the step spent in the save call (synchronous: the whole write, fsyncs and commit; async: the
host snapshot and opening the writer, plus waiting for the previous save if it still writes). The checkpoint holds the fp32 parameters and AdamW's two
moments: 12 bytes per parameter. Target (issue 22): async blocks <= 10% of the synchronous time.
The first save of each run is left out (warm-up).

Restart: `python -m tardelli.launch --max-restarts 1` on 2 ranks with rank 1 SIGKILLed at
step 3 (TD_TEST_FAULT); the overhead is the wall time between the last step row before the
death and the first step row after the resume (rows carry "time"), minus one median step:
detection, teardown, a fresh job (interpreter, MPI, model build) and the checkpoint load.
One JSON line per measurement.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rows(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def train(args, env=None, nproc=1, extra_launch=()):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), **(env or {}))
    if nproc > 1:
        cmd = [sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc), *extra_launch,
               "-m", "tardelli.train", *args]
    else:
        cmd = [sys.executable, "-m", "tardelli.train", *args]
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--save-interval", type=int, default=15,
                   help="steps between saves: long enough for a background write to finish")
    p.add_argument("--saves", type=int, default=4)
    a = p.parse_args()
    model = ["--synthetic-data", "--vocab-size", str(a.vocab), "--layers", str(a.layers),
             "--d-model", str(a.d_model), "--heads", "8", "--seq-len", "32",
             "--micro-batch-size", "1", "--no-progress", "--eval-interval", "0"]
    with tempfile.TemporaryDirectory() as d:
        out = {}
        for mode, extra in (("sync", []), ("async", ["--async-save"])):
            m = os.path.join(d, f"{mode}.jsonl")
            train(model + ["--steps", str(a.save_interval * a.saves), "--save-interval",
                           str(a.save_interval), "--save", os.path.join(d, mode),
                           "--metrics-file", m, *extra])
            rs = rows(m)
            out[mode] = {"blocked_s": [r["save_blocked_s"] for r in rs
                                       if "save_blocked_s" in r][1:],
                         "step_s": statistics.median(
                             r["tokens_per_s"] and 32 / r["tokens_per_s"] for r in rs)}
        size = sum(os.path.getsize(os.path.join(dp, f))
                   for dp, _, fs in os.walk(os.path.join(d, "sync", f"step_{a.save_interval:08d}"))
                   for f in fs)
        sync = statistics.median(out["sync"]["blocked_s"])
        asyn = statistics.median(out["async"]["blocked_s"])
        print(json.dumps({"bench": "checkpoint_save", "cpu": cpu_name(),
                          "checkpoint_mb": round(size / 1e6, 1),
                          "sync_blocked_s": round(sync, 4), "async_blocked_s": round(asyn, 4),
                          "async_over_sync": round(asyn / sync, 4), "target": 0.10,
                          "sync_runs": out["sync"]["blocked_s"],
                          "async_runs": out["async"]["blocked_s"]}), flush=True)

        small = ["--synthetic-data", "--vocab-size", "256", "--layers", "2", "--d-model", "64",
                 "--heads", "2", "--seq-len", "16", "--micro-batch-size", "2",
                 "--global-batch-size", "4", "--no-progress", "--eval-interval", "0",
                 "--steps", "5", "--save-interval", "1"]
        m = os.path.join(d, "restart.jsonl")
        train(small + ["--save", os.path.join(d, "restart"), "--resume", "--metrics-file", m],
              env={"TD_TEST_FAULT": "attempt0:rank1:step3:kill"}, nproc=2,
              extra_launch=("--max-restarts", "1"))
        rs = rows(m)
        steps = [r for r in rs if "step" in r and "event" not in r]
        restart = next(i for i, r in enumerate(rs) if r.get("event") == "restart")
        before = [r for r in rs[:restart] if "time" in r][-1]
        after = next(r for r in rs[restart:] if "time" in r)
        gaps = [b["time"] - a_["time"] for a_, b in zip(steps, steps[1:])
                if b["step"] == a_["step"] + 1 and b["time"] > a_["time"]]
        step_s = statistics.median(gaps) if gaps else 0.0
        print(json.dumps({"bench": "restart_overhead", "cpu": cpu_name(), "ranks": 2,
                          "last_step_before": before["step"], "first_step_after": after["step"],
                          "overhead_s": round(after["time"] - before["time"] - step_s, 3),
                          "median_step_s": round(step_s, 4)}), flush=True)


if __name__ == "__main__":
    main()
