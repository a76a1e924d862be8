"""The GPT under tensor and sequence parallelism (issue 7), through the library API and the CLI.

test_layouts_match_one_rank launches tp_gpt_worker.py (one program batching every check of a
world size, since each MPI job costs seconds to start here) at 2, 4 and 8 ranks: every (tp, dp)
layout with tp in {2, 4}, both architectures, sequence parallelism off and on, against one
process on the global batch; dropout; the per-rank parameter count; the activation memory
sequence parallelism saves. Its docstring justifies the tolerances. The rest runs
`python -m tardelli.train` under `python -m tardelli.launch` end to end.
"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tardelli as td
import tardelli.distributed as dist
from tardelli.distributed import launch

from cli_runner import ENV, ROOT, metrics, run

HERE = Path(__file__).resolve().parent
# A tiny gpt2 with a vocabulary that is padded under tp (301 -> 512); 4 samples per step:
# 1 process x 4, or dp 2 x 2 with tp 2 on 4 ranks. AdamW's eps = 1e-3 makes the update
# Lipschitz in the gradient, so final parameters can be compared tightly (tp_gpt_worker.py).
BASE = ["--synthetic-data", "--vocab-size", "301", "--layers", "2", "--d-model", "32",
        "--heads", "4", "--seq-len", "16", "--global-batch-size", "4", "--steps", "4",
        "--warmup-steps", "1", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
        "--log-interval", "1", "--eps", "1e-3"]
TP = ["--tp", "2", "--sequence-parallel", "--micro-batch-size", "2"]

pytestmark = pytest.mark.skipif(
    not dist.mpi_available() or launch.shutil.which("mpirun") is None,
    reason="this build has no MPI backend or mpirun is missing")


@pytest.mark.parametrize("nproc", [2, 4, 8])
def test_layouts_match_one_rank(nproc):
    """Every check of tp_gpt_worker.py passes on every rank (2: tp2; 4: tp2 x dp2, tp4 and two
    ZeRO-1 runs; 8: tp4 x dp2, tp2 x dp4): per-step losses (relative 1e-5), grad norms, step-1
    gradients and final parameters equal one process's; replicated parameters identical over tp
    and shards over dp; dropout reproducible and on; local parameter counts exact; sequence
    parallelism saves activation memory. The measured numbers are printed (pytest -s)."""
    r = subprocess.run([sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc),
                        "--timeout", "60", "--max-time", "150",
                        str(HERE / "tp_gpt_worker.py")],
                       env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stdout.count(f"TPGPT OK {nproc}") == 1, r.stdout
    print(r.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process on the global batch; tp 2 + sp x dp 2 uninterrupted; the same stopped after
    step 2 (--exit-interval) and --resume'd. Every run saves its final checkpoint."""
    d = tmp_path_factory.mktemp("tp_cli")
    run(1, "tardelli.train", *BASE, "--micro-batch-size", "4", "--metrics-file", d / "one.jsonl",
        "--save", d / "one")
    out = run(4, "tardelli.train", *BASE, *TP, "--metrics-file", d / "tp.jsonl").stdout
    part = ["--metrics-file", d / "part.jsonl", "--save", d / "save"]
    run(4, "tardelli.train", *BASE, *TP, *part, "--exit-interval", "2")
    stopped = sorted(p.name for p in (d / "save").glob("step_*"))
    run(4, "tardelli.train", *BASE, *TP, *part, "--resume")
    return {"dir": d, "tp_stdout": out, "stopped": stopped}


def test_cli_tp2_sp_matches_one_process(runs):
    # Property: tp 2 with sequence parallelism x dp 2 on 4 ranks trains the one-process model
    # on the same global batch: per-step losses and grad norms equal to fp32 rounding (relative
    # 1e-5; see tp_gpt_worker.py), and the summary reports the layout and the local parameter
    # count (rank 0 only prints it).
    one, tp = metrics(runs["dir"] / "one.jsonl"), metrics(runs["dir"] / "tp.jsonl")
    assert [m["step"] for m in tp] == [1, 2, 3, 4]
    np.testing.assert_allclose([m["loss"] for m in tp], [m["loss"] for m in one], rtol=1e-5)
    np.testing.assert_allclose([m["grad_norm"] for m in tp], [m["grad_norm"] for m in one],
                               rtol=1e-5)
    ends = [json.loads(x) for x in runs["tp_stdout"].splitlines() if '"train_end"' in x]
    assert len(ends) == 1
    assert ends[0]["tp"] == 2 and ends[0]["dp"] == 2
    assert ends[0]["local_params"] < ends[0]["params"]


def test_cli_resume_is_exact(runs):
    # Property: a tp run stopped after step 2 and resumed (each tp rank reloads its model and
    # optimizer shards and its split dropout stream) repeats the uninterrupted run bit for bit;
    # the checkpoint holds one model and one optimizer file per tp rank.
    d = runs["dir"]
    assert runs["stopped"] == ["step_00000002"]
    part, full = metrics(d / "part.jsonl"), metrics(d / "tp.jsonl")
    assert [(m["step"], m["loss"], m["grad_norm"]) for m in part] == \
        [(m["step"], m["loss"], m["grad_norm"]) for m in full]
    files = sorted(p.name for p in (d / "save" / "step_00000004").glob("*.safetensors"))
    assert files == [f"shards.rank{r:05d}.safetensors" for r in range(4)]


def test_cli_resume_at_another_tp_continues(runs, tmp_path):
    # Property (Note [Layout-free checkpoints]): the tp=2 checkpoint of step 2 resumed at tp=1
    # (2 ranks of dp, the same global batch) reads the full tensors back from the tp shards
    # (vocabulary padding dropped) and continues the uninterrupted tp run's losses and grad
    # norms to fp32 rounding (relative 1e-5, as the layouts' sums differ in order).
    save = tmp_path / "save"
    shutil.copytree(runs["dir"] / "save" / "step_00000002", save / "step_00000002")
    (save / "latest").write_text("step_00000002\n")
    m = tmp_path / "m.jsonl"
    p = run(2, "tardelli.train", *BASE, "--micro-batch-size", "2", "--save", save, "--resume",
            "--metrics-file", m)
    assert "resharded from another layout" in p.stdout, p.stdout
    got, want = metrics(m), metrics(runs["dir"] / "tp.jsonl")
    assert [r["step"] for r in got] == [3, 4]
    for k in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[k] for r in got], [r[k] for r in want[2:]], rtol=1e-5)


def test_generate_from_tp_checkpoint(runs, tmp_path):
    # Property: the tp=2 checkpoint assembles into the full model (the padding dropped), which
    # equals the one-process run's final model (absolute 5e-6, the argument of tp_gpt_worker.py's
    # final-parameter check; the parameters move ~6e-3 in these steps), greedy-decodes the same
    # tokens, and `python -m tardelli.generate` samples from it.
    from tardelli.data.tokenizer import Tokenizer
    from tardelli.train import state
    step = runs["dir"] / "save" / "step_00000004"
    tp_model, _ = state.load_model(str(step))
    one_model, _ = state.load_model(str(runs["dir"] / "one" / "step_00000004"))
    assert tp_model.tp_size == 1 and tp_model.config == one_model.config
    want = dict(one_model.named_parameters())
    for name, p in tp_model.named_parameters():
        assert tuple(p.shape) == tuple(want[name].shape), name
        np.testing.assert_allclose(p.detach().numpy(), want[name].detach().numpy(), rtol=0,
                                   atol=5e-6, err_msg=name)
    idx = td.tensor([[1, 5, 9, 42]], dtype=td.int64)
    assert tp_model.generate(idx, 8, top_k=1).tolist() == one_model.generate(idx, 8,
                                                                             top_k=1).tolist()
    # Synthetic data has no tokenizer: a byte-level one (256 bytes + <|endoftext|> < 301 ids).
    tok_dir = tmp_path / "tok"
    Tokenizer.train(["the cat sees the river."], vocab_size=257).save(str(tok_dir))
    p = run(1, "tardelli.generate", "--checkpoint", runs["dir"] / "save", "--tokenizer-dir",
            tok_dir, "--prompt", "the cat", "--num-samples", "2", "--max-new-tokens", "6")
    assert p.stdout.count("--- sample") == 2
    assert all(s.strip().startswith("the cat") for s in p.stdout.split("---")[2::2]), p.stdout


@pytest.mark.parametrize("nproc, args, names", [
    (4, ["--tp", "3"], ["--tp 3", "4 ranks"]),
    (4, ["--tp", "4", "--heads", "2"], ["--tp 4", "--heads 2"]),
    (4, ["--tp", "4", "--arch", "llama", "--kv-heads", "2"], ["--tp 4", "--kv-heads"]),
    (2, ["--tp", "2", "--sequence-parallel", "--seq-len", "15"],
     ["--sequence-parallel", "--seq-len 15"]),
    (1, ["--sequence-parallel"], ["--sequence-parallel", "--tp"]),
])
def test_cli_bad_layouts(nproc, args, names):
    # Property: a layout the model cannot be split into is a configuration error (exit 2)
    # naming the flags involved, before any training.
    p = run(nproc, "tardelli.train", *BASE, "--micro-batch-size", "1", *args, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    for n in names:
        assert n in p.stderr, p.stderr
    assert "step" not in p.stdout
