"""Running `python -m ...` (through the launcher for several ranks) from the multi-rank CLI tests
(test_gpt_tensor_parallel.py, test_pipeline_parallel.py, test_train_distributed.py,
test_train_zero.py, test_train_moe.py, test_train_recompute.py, test_train_host_staged.py,
test_train_tag_matched.py)."""
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


def train_losses(metrics_file, nproc, args, env, comm_backend):
    """The per-step losses `python -m tardelli.train args` on `nproc` ranks (environment `env`)
    writes to `metrics_file`, after asserting that it exited cleanly and that its train_end line
    names `comm_backend` (which communicator the ranks used)."""
    p = subprocess.run([sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc),
                        "--timeout", "60", "-m", "tardelli.train", *args,
                        "--metrics-file", str(metrics_file)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    end = [json.loads(line) for line in p.stdout.splitlines() if '"train_end"' in line]
    assert end and end[0]["comm_backend"] == comm_backend, end
    return [json.loads(line)["loss"] for line in open(metrics_file)]


def kill_at_async_save(argv, env, step_dir="step_00000002"):
    """Runs `argv` (a trainer with --async-save and TD_TEST_ASYNC_SAVE_DELAY in `env`) and sends
    it SIGKILL as soon as it reports the background save of `step_dir`; returns (returncode,
    the lines it printed). The test aid of both trainers' crash-during-save tests."""
    import signal
    p = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if "saving" in line and step_dir in line:
                p.send_signal(signal.SIGKILL)
                break
    finally:
        p.wait(timeout=60)
    return p.returncode, seen


def metrics(path):
    """The records of a --metrics-file (JSON lines)."""
    return [json.loads(line) for line in open(path)]


def make_corpus(d, seed=0):
    """A small regular corpus (sentences of a tiny grammar) under directory `d`, preprocessed
    into a byte-level BPE of 300 tokens; returns the dataset prefix (for --data)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    subj = ["the cat", "a dog", "my friend", "the old man", "every child"]
    verb = ["sees", "likes", "finds", "follows", "paints"]
    obj = ["the red ball", "a small house", "the river", "an open door"]
    docs = [" ".join(f"{subj[rng.integers(5)]} {verb[rng.integers(5)]} {obj[rng.integers(4)]}."
                     for _ in range(rng.integers(2, 6))) for _ in range(300)]
    (d / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    run(1, "tardelli.data.preprocess", "--input", d / "corpus.txt", "--output-prefix",
        d / "corpus", "--vocab-size", "300", timeout=300)
    return str(d / "corpus")

