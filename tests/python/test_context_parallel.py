"""python -m tardelli.train under context parallelism (--cp N, --cp-comm ring|a2a), alone and
with tp (+sp), pp and dp + ZeRO-1, against one process on the same global batch; exact resume
at cp 2; the configuration errors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tardelli as td

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python"), TD_COMM_TIMEOUT_S="60",
           OMP_NUM_THREADS="1")
# 8 samples of 32 tokens per step; 4 heads (a2a at cp 4 splits them one per rank).
BASE = ["--synthetic-data", "--vocab-size", "128", "--layers", "2", "--d-model", "64",
        "--heads", "4", "--seq-len", "32", "--global-batch-size", "8", "--steps", "3",
        "--warmup-steps", "1", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
        "--log-interval", "1", "--ddp-bucket-mb", "0.05"]
LLAMA = ["--arch", "llama", "--kv-heads", "2"]

pytestmark = pytest.mark.skipif(not td.distributed.mpi_available(),
                                reason="built without MPI (TD_WITH_MPI=OFF)")


def run(nproc, *args):
    prefix = [sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc),
              "--max-time", "300"] if nproc > 1 else [sys.executable]
    return subprocess.run(prefix + ["-m", "tardelli.train", *BASE, *args], env=ENV,
                          capture_output=True, text=True, timeout=400)


def train(nproc, *args):
    p = run(nproc, *args)
    assert p.returncode == 0, f"{args}: {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = {}
    for arch, extra in (("gpt2", []), ("llama", LLAMA)):
        m = tmp_path_factory.mktemp("ref") / f"{arch}.jsonl"
        train(1, "--micro-batch-size", "8", "--metrics-file", str(m), *extra)
        out[arch] = losses(m)
    return out


# (nproc, arch, args): every layout sees the same 8 samples per step.
CASES = [
    (2, "gpt2", ["--cp", "2", "--micro-batch-size", "8"]),
    (2, "gpt2", ["--cp", "2", "--cp-comm", "a2a", "--micro-batch-size", "8"]),
    (4, "gpt2", ["--cp", "4", "--micro-batch-size", "8"]),
    (4, "gpt2", ["--cp", "4", "--cp-comm", "a2a", "--micro-batch-size", "8"]),
    (2, "llama", ["--cp", "2", "--micro-batch-size", "8"]),
    (2, "llama", ["--cp", "2", "--cp-comm", "a2a", "--micro-batch-size", "8"]),
    (4, "gpt2", ["--cp", "2", "--tp", "2", "--sequence-parallel", "--micro-batch-size", "8"]),
    (4, "llama", ["--cp", "2", "--tp", "2", "--sequence-parallel", "--micro-batch-size", "8"]),
    (4, "gpt2", ["--cp", "2", "--pp", "2", "--micro-batch-size", "4"]),
    (4, "gpt2", ["--cp", "2", "--pp", "2", "--schedule", "gpipe", "--micro-batch-size", "4"]),
    (4, "gpt2", ["--cp", "2", "--pp", "2", "--schedule", "zb", "--micro-batch-size", "4"]),
    (4, "gpt2", ["--cp", "2", "--zero", "1", "--micro-batch-size", "4"]),
]


@pytest.mark.parametrize("nproc, arch, args", CASES,
                         ids=[f"{a}-" + "-".join(x.lstrip("-") for x in c if x not in
                                                 ("--micro-batch-size", "8", "4"))
                              for _, a, c in CASES])
def test_context_parallel_losses_match_one_rank(reference, tmp_path, nproc, arch, args):
    # Property: splitting each sequence over cp ranks (zigzag), alone or with tp/sp, pp or
    # dp + ZeRO-1, computes the same model: attention is exact up to the merge's rounding and
    # the gradients are the same means summed in another order, so the losses over 3 AdamW
    # steps agree with one process to fp32 rounding (relative 1e-5).
    m = tmp_path / "m.jsonl"
    out = train(nproc, *args, "--metrics-file", str(m), *(LLAMA if arch == "llama" else []))
    np.testing.assert_allclose(losses(m), reference[arch], rtol=1e-5)
    ends = [json.loads(line) for line in out.splitlines() if '"train_end"' in line]
    assert len(ends) == 1 and ends[0]["cp"] == int(args[1])


def test_context_parallel_interleaved_pipeline(tmp_path):
    # Property: cp 2 under the interleaved schedule (pp 2 x vpp 2, 4 layers, 4 micro-batches)
    # gives the one-process losses too.
    args = ["--layers", "4", "--micro-batch-size", "2"]
    ref, m = tmp_path / "ref.jsonl", tmp_path / "m.jsonl"
    train(1, *args, "--metrics-file", str(ref))
    train(4, *args, "--cp", "2", "--pp", "2", "--vpp", "2", "--schedule", "interleaved",
          "--metrics-file", str(m))
    np.testing.assert_allclose(losses(m), losses(ref), rtol=1e-5)


def test_context_parallel_resume_is_exact(tmp_path):
    # Property: a cp 2 run stopped after step 2 and resumed repeats the uninterrupted run's
    # losses bit for bit (the checkpoint holds replicated parameters: cp rank 0 writes them).
    args = ["--cp", "2", "--micro-batch-size", "8", "--steps", "4"]
    full, part, save = tmp_path / "full.jsonl", tmp_path / "part.jsonl", tmp_path / "save"
    train(2, *args, "--metrics-file", str(full))
    train(2, *args, "--metrics-file", str(part), "--save", str(save), "--exit-interval", "2")
    train(2, *args, "--metrics-file", str(part), "--save", str(save), "--resume")
    assert losses(part) == losses(full)
    assert len(losses(full)) == 4


@pytest.mark.parametrize("args, message", [
    (["--cp", "2", "--seq-len", "30"], "must be divisible by 2 x cp = 4"),
    (["--cp", "2", "--heads", "1", "--cp-comm", "a2a"],
     "--cp-comm a2a splits heads over tp x cp = 2"),
    (["--cp", "4"], "does not divide the 2 ranks"),
])
def test_context_parallel_config_errors(args, message):
    # Property: bad combinations stop before any work with a message naming the flags.
    p = run(2, "--micro-batch-size", "8", *args)
    assert p.returncode != 0
    assert message in p.stderr + p.stdout, p.stderr
