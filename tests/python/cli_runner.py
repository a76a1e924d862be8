"""Running `python -m ...` (through the launcher for several ranks) from the multi-rank CLI tests
(test_gpt_tensor_parallel.py, test_pipeline_parallel.py, test_train_distributed.py,
test_train_zero.py, test_train_moe.py, test_train_recompute.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python"), TD_COMM_TIMEOUT_S="60",
           OMP_NUM_THREADS="1")


def run(nproc, module, *args, check=True, timeout=120):
    """`python -m module args` on `nproc` ranks (one plain process for nproc 1); asserts exit
    status 0 unless check=False. Returns the CompletedProcess."""
    prefix = [sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc), "--timeout", "60",
              "--max-time", str(timeout - 20)] if nproc > 1 else [sys.executable]
    p = subprocess.run(prefix + ["-m", module, *map(str, args)], env=ENV, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, f"{args}: {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def metrics(path):
    """The records of a --metrics-file (JSON lines)."""
    return [json.loads(line) for line in open(path)]
