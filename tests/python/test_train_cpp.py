"""tardelli-train and python -m tardelli.train: two front ends (a C++ and a Python argument
parser, tools/tardelli_train.cpp and python/tardelli/train/) of one training loop
(td::train::Trainer, Note [C++ training loop] in include/tardelli/train/trainer.h). The same
flags must give the same run, bitwise: the same loop on the same configuration, so a difference
means the front ends built different configurations or handled the run differently (output,
checkpoints, errors, restarts). The loop's C++-only paths (checkpoints at another layout, the
async saver, supervised restarts) are exercised through the binary here."""
import json
import math
import os
import re
import subprocess
import sys

import pytest

from cli_runner import ENV, ROOT, kill_at_async_save, make_corpus, metrics
from cli_runner import run as run_python


def _binary():
    """The built tardelli-train: $TD_BUILD_DIR's (scripts/test.sh sets it), else the newest of
    the usual build folders."""
    dirs = [os.environ["TD_BUILD_DIR"]] if os.environ.get("TD_BUILD_DIR") else \
        ["build/ci", "build/cpu", "build/cuda"]
    found = [ROOT / d / "tardelli-train" for d in dirs if (ROOT / d / "tardelli-train").is_file()]
    assert found, f"tardelli-train is not built in any of {dirs} (run scripts/setup.sh)"
    return max(found, key=lambda p: p.stat().st_mtime)


BIN = _binary()
MODEL = ["--synthetic-data", "--vocab-size", "96", "--layers", "4", "--d-model", "32",
         "--heads", "4", "--seq-len", "16", "--micro-batch-size", "2", "--steps", "4",
         "--lr", "3e-3", "--warmup-steps", "1", "--eval-interval", "2", "--eval-steps", "2",
         "--no-progress", "--dropout", "0.1"]


def run_cpp(nproc, *args, check=True, timeout=120):
    """`tardelli-train args` on nproc ranks through the launcher (one plain process for 1)."""
    prefix = [sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc), "--timeout", "60",
              "--max-time", str(timeout - 20)] if nproc > 1 else []
    p = subprocess.run(prefix + [str(BIN), *map(str, args)], env=ENV, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, f"{args}: {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def _summary(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def _history(path):
    """Per step: the numbers both front ends must agree on bitwise (the bytes handed to the
    gradient reduction too: the same buckets, compressed alike)."""
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"], r.get("val_loss"),
             r.get("dp_comm_bytes"), r.get("cross_node_bytes"), r.get("precision"),
             *[r.get(k) for k in MOE_KEYS])
            for r in metrics(path)]


FP8 = ["--fp8", "hybrid", "--fp8-amax-history", "2"]
MOE_KEYS = ("moe_aux_loss", "moe_z_loss", "moe_max_load", "moe_mean_load", "moe_dropped_tokens")
MOE = ["--num-experts", "4", "--moe-top-k", "2", "--moe-z-loss-coeff", "1e-3",
       "--moe-router-bias-update-rate", "1e-2"]


# One layout per family of the loop's code paths (the families' own properties are checked
# through python -m tardelli.train by test_train_*.py).
LAYOUTS = [
    (1, []),
    (1, ["--dtype", "bf16", "--global-batch-size", "4"]),
    (2, ["--zero", "1", "--global-batch-size", "8"]),
    (2, ["--pp", "2", "--schedule", "zb", "--global-batch-size", "6", "--recompute", "full"]),
    (4, ["--tp", "2", "--pp", "2", "--global-batch-size", "4", "--arch", "llama"]),
    (2, ["--zero", "3", "--dtype", "bf16", "--offload-optimizer", "--clip-grad", "0.05"]),
    (4, ["--cp", "2", "--tp", "2", "--sequence-parallel", "--arch", "llama"]),
    (2, ["--hierarchical-reduce", "--ranks-per-node", "1", "--grad-compression", "powersgd",
         "--powersgd-rank", "2"]),
    (4, [*MOE, "--ep", "2", "--pp", "2", "--zero", "2", "--global-batch-size", "4"]),
    (2, [*FP8, "--pp", "2", "--precision-policy", "adaptive", "--precision-fp8-error", "0.04",
         "--global-batch-size", "4"]),
]


@pytest.mark.parametrize("nproc,extra", LAYOUTS,
                         ids=[f"{n}-{'_'.join(e) or 'plain'}" for n, e in LAYOUTS])
def test_both_front_ends_train_alike(tmp_path, nproc, extra):
    """Per-step loss, gradient norm, learning rate and validation loss are bitwise equal, and
    both front ends describe the run alike (the layout line, the summary's layout and parameter
    count)."""
    py_m, cpp_m = tmp_path / "py.jsonl", tmp_path / "cpp.jsonl"
    py = run_python(nproc, "tardelli.train", *MODEL, *extra, "--metrics-file", py_m)
    cpp = run_cpp(nproc, *MODEL, *extra, "--metrics-file", cpp_m)
    assert _history(cpp_m) == _history(py_m)
    a, b = _summary(py.stdout), _summary(cpp.stdout)
    assert py.stdout.splitlines()[0].split("; GEMM")[0] == cpp.stdout.splitlines()[0].split(
        "; GEMM")[0]  # the layout line
    for k in ("event", "step", "params", "dp", "tp", "pp", "cp", "ep", "local_params", "loss",
              "val_loss", "microbatches", "bubble_formula", "zero", "optimizer_state_bytes",
              "host_state_bytes", "grad_buffer_bytes", "num_experts", "moe_layers",
              "moe_bias_replicated"):
        assert a.get(k) == b.get(k), k
    assert len(metrics(cpp_m)) == 4


def test_real_data_and_toml_config(tmp_path):
    """A Megatron-format dataset with its tokenizer (the vocabulary is read from it) and a TOML
    config with tables, overridden by a flag: the same losses from both front ends."""
    prefix = make_corpus(tmp_path)
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'[model]\nlayers = 2\nd-model = 32\nheads = 2\nseq_len = 16\n'
                   f'[data]\ndata = "{prefix}"\nsplit = "90,10,0"\n'
                   f'[train]\nsteps = 3\nmicro_batch_size = 4\nlr = 1e-3\n'
                   f'eval_interval = 3\neval_steps = 2\nprogress = false\n')
    py_m, cpp_m = tmp_path / "py.jsonl", tmp_path / "cpp.jsonl"
    py = run_python(2, "tardelli.train", "--config", cfg, "--steps", "4", "--metrics-file", py_m)
    cpp = run_cpp(2, "--config", cfg, "--steps", "4", "--metrics-file", cpp_m)
    assert _history(cpp_m) == _history(py_m)
    assert len(_history(cpp_m)) == 4
    assert _summary(cpp.stdout)["val_loss"] == _summary(py.stdout)["val_loss"]


def test_fp16_loss_scaling_skips_like_the_python_front_end(tmp_path):
    """fp16 with an injected overflow: the same steps are skipped with the same loss scales."""
    extra = ["--dtype", "fp16", "--inject-nonfinite-grad", "2", "--initial-loss-scale", "1024"]
    py_m, cpp_m = tmp_path / "py.jsonl", tmp_path / "cpp.jsonl"
    run_python(2, "tardelli.train", *MODEL, *extra, "--metrics-file", py_m)
    run_cpp(2, *MODEL, *extra, "--metrics-file", cpp_m)
    rows_py, rows_cpp = metrics(py_m), metrics(cpp_m)
    assert [(r["loss"], r["loss_scale"], r["skipped"]) for r in rows_cpp] == \
        [(r["loss"], r["loss_scale"], r["skipped"]) for r in rows_py]
    assert [r["skipped"] for r in rows_cpp] == [False, True, False, False]


def _exact(v):
    """A number as a comparable value: repr keeps every bit, and nan equals nan."""
    return repr(v) if isinstance(v, float) else v


def _rows(path, keys):
    return [tuple(_exact(r.get(k)) for k in keys) for r in metrics(path)]


def _log(stdout):
    """The step and straggler lines, without the measured parts (tok/s, mfu, memory, the
    straggler's seconds and ratio)."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("step "):
            out.append(re.sub(r" \| [\d,]+ tok/s \| mfu [\d.]+% \| mem \d+ MiB", "", line))
        elif line.startswith("train: straggler rank"):
            out.append(line.split(":")[1])
    return out


SKIP_KEYS = ("step", "loss", "grad_norm", "lr", "val_loss", "skipped", "nonfinite_skips")


@pytest.mark.parametrize("nproc,extra", [
    (1, ["--inject-nonfinite-grad", "2", "--inject-nonfinite-loss", "3"]),
    (2, ["--inject-nonfinite-loss", "2@1,3", "--zero", "1"]),
    (2, ["--dtype", "fp16", "--inject-nonfinite-grad", "2", "--inject-nonfinite-loss", "3@0",
         "--initial-loss-scale", "1024"]),
], ids=["1-grad_and_loss", "2-one_rank_zero1", "2-fp16"])
def test_nonfinite_steps_are_skipped_like_the_python_front_end(tmp_path, nproc, extra):
    """--on-nonfinite skip (Note [Non-finite steps]): the same steps are skipped on every rank
    (a nan loss on one rank included), with the same rows (skipped, nonfinite_skips; the
    losses, gradient norms and learning rates bitwise, nan where the step's was), the same log
    lines and the same summary count."""
    args = [*MODEL, "--on-nonfinite", "skip", "--log-interval", "1", *extra]
    py_m, cpp_m = tmp_path / "py.jsonl", tmp_path / "cpp.jsonl"
    py = run_python(nproc, "tardelli.train", *args, "--metrics-file", py_m)
    cpp = run_cpp(nproc, *args, "--metrics-file", cpp_m)
    assert _rows(cpp_m, SKIP_KEYS) == _rows(py_m, SKIP_KEYS)
    assert any(r["skipped"] for r in metrics(cpp_m)) and math.isnan(metrics(cpp_m)[2]["loss"])
    assert _log(cpp.stdout) == _log(py.stdout)
    for k in ("nonfinite_skips", "skipped_steps", "loss_scale", "loss"):
        assert _exact(_summary(cpp.stdout).get(k)) == _exact(_summary(py.stdout).get(k)), k


@pytest.mark.parametrize("extra,needle", [
    (["--on-nonfinite", "skip", "--max-skipped-steps", "2", "--inject-nonfinite-grad", "2",
      "--inject-nonfinite-loss", "3"],
     "train: step 3: 2 consecutive steps (steps 2-3) skipped for a non-finite loss or gradient "
     "norm, the limit of --max-skipped-steps 2 (diverged; lower --lr or use --clip-grad)"),
    (["--inject-nonfinite-loss", "2"],
     "train: the loss is nan at step 2 (diverged; lower --lr, use --clip-grad or "
     "--on-nonfinite skip)"),
    (["--inject-nonfinite-grad", "3"], "train: the gradient norm is "),
], ids=["give_up", "raise_loss", "raise_grad"])
def test_nonfinite_runs_stop_like_the_python_front_end(tmp_path, extra, needle):
    """A run that gives up (--max-skipped-steps consecutive skips: after the step's row) or
    raises (--on-nonfinite raise) stops at the same step with the same sentence."""
    py_m, cpp_m = tmp_path / "py.jsonl", tmp_path / "cpp.jsonl"
    py = run_python(1, "tardelli.train", *MODEL, *extra, "--metrics-file", py_m, check=False)
    cpp = run_cpp(1, *MODEL, *extra, "--metrics-file", cpp_m, check=False)
    assert py.returncode != 0 and cpp.returncode == 1, (py.stderr, cpp.stderr)
    assert needle in py.stderr and needle in cpp.stderr, (py.stderr, cpp.stderr)
    assert _rows(cpp_m, SKIP_KEYS) == _rows(py_m, SKIP_KEYS)


def test_straggler_is_reported_like_the_python_front_end(tmp_path, monkeypatch):
    """TD_TEST_SLOW_RANK makes rank 1 sleep 0.3 s a step: both front ends log "train: straggler
    rank 1: ..." after the same steps (at most once per --log-interval 2), record both ranks'
    compute and wait, and train the same losses; --straggler-threshold 0 turns the line off."""
    monkeypatch.setitem(ENV, "TD_TEST_SLOW_RANK", "1:0.3")
    args = [*MODEL, "--log-interval", "2"]
    py_m, cpp_m = tmp_path / "py.jsonl", tmp_path / "cpp.jsonl"
    py = run_python(2, "tardelli.train", *args, "--metrics-file", py_m)
    cpp = run_cpp(2, *args, "--metrics-file", cpp_m)
    assert _history(cpp_m) == _history(py_m)
    assert _log(cpp.stdout) == _log(py.stdout)
    assert _log(cpp.stdout).count(" straggler rank 1") == 2, cpp.stdout
    for r in metrics(cpp_m):
        compute, wait = r["rank_compute_s"], r["rank_wait_s"]
        assert compute[1] >= 0.3 and wait[0] >= 0.2 and compute[0] < compute[1] / 1.5, r
    line = [x for x in cpp.stdout.splitlines() if "straggler" in x][0]
    assert re.fullmatch(r"train: straggler rank 1: compute \d+\.\d{3} s is \d+\.\d{2} x the "
                        r"median", line), line
    cpp = run_cpp(2, *args, "--straggler-threshold", "0")
    assert "straggler" not in cpp.stdout
    monkeypatch.setitem(ENV, "TD_TEST_SLOW_RANK", "x")
    bad = run_cpp(1, *MODEL, check=False)
    assert bad.returncode == 2 and "TD_TEST_SLOW_RANK='x': expected RANK:SECONDS" in bad.stderr


@pytest.mark.parametrize("args,needle", [
    (["--no-such-flag", "1"], "--no-such-flag"),
    (["--tp", "3"], "does not divide"),
    (["--heads", "5"], "does not divide --d-model"),
    (["--schedule", "bogus"], "bogus"),
])
def test_bad_input_is_rejected_like_the_python_front_end(tmp_path, args, needle):
    """Exit status 2 and a message naming the problem, on both front ends; a layout that cannot
    be formed gives the same sentence."""
    py = run_python(1, "tardelli.train", *MODEL, *args, check=False)
    cpp = run_cpp(1, *MODEL, *args, check=False)
    assert py.returncode == 2 and cpp.returncode == 2, (py.stderr, cpp.stderr)
    assert needle in py.stderr and needle in cpp.stderr, (py.stderr, cpp.stderr)
    assert "Traceback" not in cpp.stderr


def test_bad_toml_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("layers = = 3\n")
    cpp = run_cpp(1, "--config", bad, check=False)
    assert cpp.returncode == 2 and str(bad) in cpp.stderr and "TOML" in cpp.stderr, cpp.stderr


def test_plan_auto_in_tardelli_train(tmp_path, monkeypatch):
    """--plan auto: tardelli-train hands the flags to the Python front end's parser on rank 0
    (the planner is Python), so both front ends train the planner's pick alike: the same
    "--plan auto:" line, layout and losses. Without an interpreter that imports tardelli it
    stops before training, naming TD_PYTHON."""
    from test_plan import toy_profile
    f = tmp_path / "toy.json"
    f.write_text(json.dumps(toy_profile()))
    flags = [*MODEL, "--global-batch-size", "8", "--plan", "auto", "--plan-profile", f]
    py_m, cpp_m = tmp_path / "py.jsonl", tmp_path / "cpp.jsonl"
    monkeypatch.setitem(ENV, "TD_PYTHON", sys.executable)
    py = run_python(2, "tardelli.train", *flags, "--metrics-file", py_m)
    cpp = run_cpp(2, *flags, "--metrics-file", cpp_m)
    chosen = [[x for x in p.stdout.splitlines() if "--plan auto:" in x] for p in (py, cpp)]
    assert len(chosen[0]) == 1 and chosen[0] == chosen[1], (py.stdout, cpp.stdout)
    a, b = _summary(py.stdout), _summary(cpp.stdout)
    assert [a[k] for k in ("tp", "pp", "dp", "cp")] == [b[k] for k in ("tp", "pp", "dp", "cp")]
    assert _history(cpp_m) == _history(py_m)
    monkeypatch.setitem(ENV, "TD_PYTHON", str(tmp_path / "no-python"))
    bad = run_cpp(2, *flags, check=False)
    assert bad.returncode == 2 and "TD_PYTHON" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and "train_end" not in bad.stdout


def test_help_lists_every_flag():
    p = run_cpp(1, "--help")
    assert p.returncode == 0
    for flag in ("--tp", "--pipeline-layout", "--sequence-parallel", "--config", "--zero"):
        assert flag in p.stdout


# ---- checkpoints: the C++ loop writes and reads python -m tardelli.train's (Note [One checkpoint
# format for both loops] in include/tardelli/train/train_state.h) ----

import shutil  # noqa: E402
import signal  # noqa: E402

import numpy as np  # noqa: E402

import tardelli as td  # noqa: E402

STEP2 = "step_00000002"


def _checkpoint(save, step=2):
    """The files of a step directory (name -> bytes) and its meta.json without the flags that
    name paths."""
    path = save / td.checkpoint.step_dir_name(step)
    files = {f.name: f.read_bytes() for f in sorted(path.iterdir()) if f.name != "meta.json"}
    meta = td.checkpoint.CheckpointReader(str(path)).meta()
    for k in ("save", "metrics_file"):
        meta["train"].pop(k)
    return files, meta


CROSS = [
    (1, []),
    (2, ["--dtype", "fp16", "--inject-nonfinite-grad", "2", "--initial-loss-scale", "1024"]),
    (4, ["--tp", "2", "--pp", "2", "--global-batch-size", "4", "--arch", "llama"]),
    # meta.json's "nonfinite" counters: step 1 skipped, the resumed half goes on counting.
    (2, ["--on-nonfinite", "skip", "--inject-nonfinite-grad", "1"]),
    # The rng files' FP8 scalings and adaptive-policy state (per chunk, per linear).
    (2, [*FP8, "--tp", "2", "--precision-policy", "adaptive", "--precision-fp8-error", "0.04",
         "--precision-stable-steps", "1"]),
    (2, ["--zero", "3", "--global-batch-size", "8"]),
    (2, [*MOE, "--ep", "2", "--zero", "1"]),
    # The compressors' error feedback (compression.rankN.safetensors, per DDP).
    (2, ["--grad-compression", "powersgd", "--powersgd-rank", "2"]),
]


@pytest.mark.parametrize("nproc,extra", CROSS,
                         ids=[f"{n}-{'_'.join(e) or 'plain'}" for n, e in CROSS])
def test_checkpoints_cross_between_the_front_ends(tmp_path, nproc, extra):
    """Both loops stop after step 2 (--exit-interval) and save: the step directories hold the
    same files, byte for byte (meta.json: the same members but the paths given). Each loop then
    resumes the other's checkpoint and continues the uninterrupted run bitwise, dropout streams
    and the fp16 loss scale included; the metrics file of the first half is continued."""
    full = tmp_path / "full.jsonl"
    run_python(nproc, "tardelli.train", *MODEL, *extra, "--metrics-file", full)
    cpp_save, py_save = tmp_path / "cpp", tmp_path / "py"
    c2p, p2c = tmp_path / "c2p.jsonl", tmp_path / "p2c.jsonl"
    cpp = run_cpp(nproc, *MODEL, *extra, "--save", cpp_save, "--exit-interval", "2",
                  "--metrics-file", c2p)
    run_python(nproc, "tardelli.train", *MODEL, *extra, "--save", py_save, "--exit-interval",
               "2", "--metrics-file", p2c)
    assert f"train: saved {cpp_save / STEP2}\n" in cpp.stdout
    assert _summary(cpp.stdout)["step"] == 2
    assert (cpp_save / "latest").read_text() == STEP2 + "\n"
    cpp_files, cpp_meta = _checkpoint(cpp_save)
    py_files, py_meta = _checkpoint(py_save)
    assert sorted(cpp_files) == sorted(py_files)
    for name in py_files:
        assert cpp_files[name] == py_files[name], name
    assert cpp_meta == py_meta
    py = run_python(nproc, "tardelli.train", *MODEL, *extra, "--save", cpp_save, "--resume",
                    "--metrics-file", c2p)
    cpp = run_cpp(nproc, *MODEL, *extra, "--save", py_save, "--resume", "--metrics-file", p2c)
    assert f"train: resumed from {cpp_save / STEP2} at step 2" in py.stdout
    assert f"train: resumed from {py_save / STEP2} at step 2" in cpp.stdout
    assert "resharded" not in cpp.stdout
    assert _history(c2p) == _history(full)
    assert _history(p2c) == _history(full)
    assert [r["step"] for r in metrics(p2c)] == [1, 2, 3, 4]
    rows = metrics(p2c)
    assert "save_blocked_s" in rows[1] and "save_blocked_s" in rows[3]
    assert "save_blocked_s" not in rows[0]
    if "fp16" in extra:
        assert [r["loss_scale"] for r in rows] == [r["loss_scale"] for r in metrics(full)]
    if "skip" in extra:
        assert [r["nonfinite_skips"] for r in rows] == [1, 1, 1, 1]
        assert [r["nonfinite_skips"] for r in metrics(c2p)] == [1, 1, 1, 1]
        assert cpp_meta["nonfinite"] == {"skips": 1, "consecutive": 0}


# Layout-free resume (tests/python/test_checkpoint_reshard.py's setting: no dropout, eps 1e-3,
# a padded vocabulary under tp, gpt2's tied table on the last stage).
RESHARD = ["--synthetic-data", "--vocab-size", "301", "--layers", "4", "--d-model", "32",
           "--heads", "4", "--seq-len", "16", "--global-batch-size", "8", "--micro-batch-size",
           "2", "--steps", "4", "--warmup-steps", "1", "--lr", "3e-3", "--eps", "1e-3",
           "--no-progress", "--eval-interval", "0", "--log-interval", "1"]
TP2PP2 = ["--tp", "2", "--pp", "2"]


def test_resume_at_another_layout_across_the_front_ends(tmp_path):
    """A tp 2 x pp 2 checkpoint of each loop resumes in the other at dp 2 with ZeRO-1 (and the
    C++ one in C++ at tp 4 with ZeRO-2), continuing the uninterrupted run to fp32 rounding
    (rtol 1e-5, as test_checkpoint_reshard.py)."""
    full = tmp_path / "full.jsonl"
    run_cpp(4, *RESHARD, *TP2PP2, "--metrics-file", full)
    want = metrics(full)[2:]
    cpp_save, py_save = tmp_path / "cpp", tmp_path / "py"
    run_cpp(4, *RESHARD, *TP2PP2, "--save", cpp_save, "--exit-interval", "2")
    run_python(4, "tardelli.train", *RESHARD, *TP2PP2, "--save", py_save, "--exit-interval", "2")
    again = tmp_path / "again"
    shutil.copytree(cpp_save, again)
    cases = [(run_python, 2, cpp_save, ["--zero", "1"]), (run_cpp, 2, py_save, ["--zero", "1"]),
             (run_cpp, 4, again, ["--tp", "4", "--zero", "2"])]
    for runner, nproc, save, layout in cases:
        m = tmp_path / f"{save.name}-{nproc}.jsonl"
        args = (*RESHARD, *layout, "--save", save, "--resume", "--metrics-file", m)
        p = runner(nproc, "tardelli.train", *args) if runner is run_python else \
            runner(nproc, *args)
        assert "resharded from another layout" in p.stdout, p.stdout
        got = metrics(m)
        assert [r["step"] for r in got] == [3, 4]
        for k in ("loss", "grad_norm"):
            np.testing.assert_allclose([r[k] for r in got], [r[k] for r in want], rtol=1e-5,
                                       err_msg=f"{save.name} {layout} {k}")


def test_zero3_and_compressed_checkpoints_at_another_layout(tmp_path):
    """A ZeRO-3 dp 2 checkpoint of the C++ loop resumes at tp 2 without ZeRO and continues the
    uninterrupted run to fp32 rounding (rtol 1e-5, as above: the same values in other shards).
    A PowerSGD dp 2 checkpoint resumed at dp 4 says that the error feedback (per-rank state of
    another layout) starts at zero; resumed at dp 2 it says nothing of the kind."""
    full = tmp_path / "full.jsonl"
    run_cpp(2, *RESHARD, "--zero", "3", "--metrics-file", full)
    save = tmp_path / "z3"
    run_cpp(2, *RESHARD, "--zero", "3", "--save", save, "--exit-interval", "2")
    m = tmp_path / "tp2.jsonl"
    p = run_cpp(2, *RESHARD, "--tp", "2", "--save", save, "--resume", "--metrics-file", m)
    assert "resharded from another layout" in p.stdout
    got, want = metrics(m), metrics(full)[2:]
    assert [r["step"] for r in got] == [3, 4]
    for k in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[k] for r in got], [r[k] for r in want], rtol=1e-5)
    comp = ["--grad-compression", "powersgd", "--powersgd-rank", "2"]
    save = tmp_path / "psgd"
    run_cpp(2, *RESHARD, *comp, "--save", save, "--exit-interval", "2")
    shutil.copytree(save, tmp_path / "psgd2")
    note = "the gradient compressors' error feedback starts at zero"
    p = run_cpp(4, *RESHARD, *comp, "--save", save, "--resume")
    assert note in p.stdout and _summary(p.stdout)["step"] == 4
    p = run_cpp(2, *RESHARD, *comp, "--save", tmp_path / "psgd2", "--resume")
    assert note not in p.stdout and _summary(p.stdout)["step"] == 4


def test_exit_interval_and_resume_in_the_cpp_loop(tmp_path):
    """--exit-interval stops and saves; --resume continues bitwise; a resume from an older
    checkpoint (the newest one lost) drops the metrics rows after it and repeats the steps."""
    full, m, save = tmp_path / "full.jsonl", tmp_path / "m.jsonl", tmp_path / "save"
    run_cpp(2, *MODEL, "--zero", "2", "--metrics-file", full)
    first = run_cpp(2, *MODEL, "--zero", "2", "--save", save, "--exit-interval", "2",
                    "--metrics-file", m)
    assert _summary(first.stdout)["step"] == 2 and len(metrics(m)) == 2
    run_cpp(2, *MODEL, "--zero", "2", "--save", save, "--resume", "--save-interval", "1",
            "--metrics-file", m)
    assert _history(m) == _history(full)
    assert sorted(p.name for p in save.iterdir()) == \
        ["latest", STEP2, "step_00000003", "step_00000004"]
    shutil.rmtree(save / "step_00000004")
    shutil.rmtree(save / "step_00000003")
    again = run_cpp(2, *MODEL, "--zero", "2", "--save", save, "--resume", "--metrics-file", m)
    assert f"train: resumed from {save / STEP2} at step 2 (8 samples consumed)" in again.stdout
    assert _history(m) == _history(full)


def test_async_save_in_the_cpp_loop(tmp_path):
    """--async-save writes what python's --async-save writes, step by step; a process killed
    while its writer is slowed (test hook) keeps the previous checkpoint, which Python
    resumes bitwise."""
    extra = ["--zero", "1", "--save-interval", "1", "--async-save"]
    cpp_save, py_save = tmp_path / "cpp", tmp_path / "py"
    run_cpp(2, *MODEL, *extra, "--save", cpp_save)
    run_python(2, "tardelli.train", *MODEL, *extra, "--save", py_save)
    for step in range(1, 5):
        assert _checkpoint(cpp_save, step) == _checkpoint(py_save, step), step

    save, m = tmp_path / "killed", tmp_path / "m.jsonl"
    env = dict(ENV, TD_TEST_ASYNC_SAVE_DELAY="3")
    code, seen = kill_at_async_save([str(BIN), *MODEL, "--save-interval", "1", "--async-save",
                                     "--save", str(save), "--metrics-file", str(m)], env)
    assert code == -signal.SIGKILL, "".join(seen)
    assert any(f"saved {save / 'step_00000001'} (in the background)" in x for x in seen), seen
    latest = td.checkpoint.find_latest(str(save))
    assert latest.endswith("step_00000001")
    td.checkpoint.CheckpointReader(latest).verify()
    assert not (save / STEP2).exists()
    run_python(1, "tardelli.train", *MODEL, "--save", save, "--resume", "--metrics-file", m)
    full = tmp_path / "full.jsonl"
    run_cpp(1, *MODEL, "--metrics-file", full)
    assert _history(m) == _history(full)


def _flip_byte(path, at=200):
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_bad_checkpoints_are_refused_like_the_python_front_end(tmp_path):
    """No checkpoint, a save that never completed, a damaged file, another model, other data
    settings: exit status 2 and python's message, word for word."""
    save = tmp_path / "save"
    run_cpp(1, *MODEL, "--save", save, "--exit-interval", "2")
    (tmp_path / "partial" / "step_00000002.tmp").mkdir(parents=True)
    damaged = tmp_path / "damaged"
    shutil.copytree(save, damaged)
    _flip_byte(damaged / STEP2 / "shards.rank00000.safetensors")
    cases = [
        (["--save", tmp_path / "none"], "(the directory does not exist)"),
        (["--save", tmp_path / "partial"], "(it holds step_00000002.tmp; a *.tmp directory"),
        (["--save", damaged], "'shards.rank00000.safetensors' is damaged"),
        (["--save", save, "--layers", "3"], "was saved from a different model"),
        (["--save", save, "--split", "90,5,5"], "split: '90,5,5' vs '98,1,1'"),
    ]
    for args, needle in cases:
        py = run_python(1, "tardelli.train", *MODEL, *args, "--resume", check=False)
        cpp = run_cpp(1, *MODEL, *args, "--resume", check=False)
        assert py.returncode == 2 and cpp.returncode == 2, (args, py.stderr, cpp.stderr)
        assert needle in cpp.stderr, (args, cpp.stderr)
        assert cpp.stderr.split("error: ", 1)[1] == py.stderr.split("error: ", 1)[1], args


def test_a_checkpoint_damaged_for_one_rank_fails_every_rank(tmp_path):
    """A data file only rank 1 reads (its ZeRO shard of the moments) is damaged: every rank
    fails with status 2 instead of rank 0 waiting in the first step's collectives."""
    save = tmp_path / "save"
    run_cpp(2, *MODEL, "--zero", "1", "--save", save, "--exit-interval", "2")
    _flip_byte(save / STEP2 / "shards.rank00001.safetensors")
    cpp = run_cpp(2, *MODEL, "--zero", "1", "--save", save, "--resume", check=False, timeout=60)
    assert cpp.returncode == 2, cpp.stderr
    assert "'shards.rank00001.safetensors' is damaged" in cpp.stderr
    assert "failed on another rank" in cpp.stderr


def test_supervised_restart_of_the_cpp_loop(tmp_path):
    """tardelli-train under python -m tardelli.launch --max-restarts: rank 1 SIGKILLed at step
    3 of attempt 0 (TD_TEST_FAULT, at that step's heartbeat); the launcher restarts the job,
    which resumes from step 2's checkpoint (the first attempt started from scratch with
    --resume). The effective history (each step's last row) is the Python front end's
    uninterrupted run, bitwise, and the metrics file holds the restart event between the
    attempts, as the Python front end writes it (Note [Supervised metrics])."""
    from tardelli.train import report
    full = tmp_path / "full.jsonl"
    run_python(2, "tardelli.train", *MODEL, "--metrics-file", full)
    m, save = tmp_path / "m.jsonl", tmp_path / "save"
    env = dict(ENV, TD_TEST_FAULT="attempt0:rank1:step3:kill")
    p = subprocess.run([sys.executable, "-m", "tardelli.launch", "--nproc", "2", "--timeout", "60",
                        "--max-restarts", "2", "--heartbeat-timeout", "30", str(BIN), *MODEL,
                        "--save", str(save), "--save-interval", "2", "--resume",
                        "--metrics-file", str(m)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    assert "no checkpoint under" in p.stdout and "supervised attempt 0" in p.stdout
    assert "attempt 0 failed: rank 1 (pid " in p.stderr
    assert f"train: resumed from {save / STEP2} at step 2" in p.stdout
    rows = report.read_metrics(m)
    # Rank 0 wrote step 3's row before rank 1 died at that step's heartbeat: the step repeats.
    assert [r.get("event", r["step"]) for r in rows] == [1, 2, 3, "restart", 3, 4]
    assert rows[3]["attempt"] == 1 and rows[3]["step"] == 2 and "signal 9" in rows[3]["cause"]
    assert rows[2]["loss"] == rows[4]["loss"]
    eff = [(r["step"], r["loss"], r["grad_norm"], r.get("val_loss"))
           for r in report.effective_rows(rows)]
    assert eff == [(r["step"], r["loss"], r["grad_norm"], r.get("val_loss"))
                   for r in metrics(full)]


def test_supervised_cpp_loop_needs_save_and_resume(tmp_path):
    """Under the supervisor a run without --save DIR --resume could not continue after a
    restart: refused before training, with the Python front end's text."""
    env = dict(ENV, TD_RESTART_ATTEMPT="0", TD_HEARTBEAT_DIR=str(tmp_path))
    p = subprocess.run([str(BIN), *MODEL], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    assert "give --save DIR --resume" in p.stderr
