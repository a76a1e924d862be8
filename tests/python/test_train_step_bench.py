"""benchmarks/train_step.py end to end on a tiny model: the timing rounds, the memory runs and the
interleaved steps (Note [Interleaved steps]) run, td and torch start from the same weights
(equal step-0 loss, to fp32 rounding), and the summary carries the fields the docs quote. It
checks that the benchmark works, not how fast anything is."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_train_step_bench_tiny_with_torch_and_interleave():
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "train_step.py"), "--layers", "1",
           "--d-model", "64", "--heads", "2", "--seq-len", "32", "--vocab-size", "256",
           "--micro-batch-size", "2", "--steps", "2", "--warmup", "1", "--threads", "1",
           "--compare-torch", "--torch-configs", "default", "--torch-steps", "2",
           "--rounds", "2", "--interleave", "3"]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
    summary = lines[-1]
    assert summary["bench"] == "train_step" and summary["rounds"] == 2
    assert len(summary["speedup_vs_torch_rounds"]) == 2
    assert summary["interleaved_steps"] == 3
    inter = [ln for ln in lines if "td_step_times_ms" in ln]
    assert len(inter) == 1 and len(inter[0]["td_step_times_ms"]) == 3
    assert len(inter[0]["torch"]["torch-default"]["step_times_ms"]) == 3
    for key in ("speedup_vs_torch", "speedup_vs_torch_interleaved",
                "speedup_vs_torch_interleaved_medians", "tokens_per_s", "mfu"):
        assert summary[key] > 0, key
    assert 0 < summary["peak_mem_bytes"] and 0 < summary["torch_peak_mem_bytes"]
    assert summary["cpu_isa"] and summary["matmul_kernel"]  # fp32 here: oneDNN's own kernel
    assert "widening" not in summary["matmul_kernel"]
    # Same initial weights and tokens: the first losses agree to fp32 rounding of a ~5.5 loss.
    assert abs(summary["loss_step0_td"] - summary["loss_step0_torch"]) < 1e-5
