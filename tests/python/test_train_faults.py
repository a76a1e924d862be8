"""Fault tolerance of `python -m tardelli.train` (docs/training.md, "Non-finite steps and
stragglers"): --on-nonfinite raise|skip with --max-skipped-steps (Note [Non-finite steps] in
src/train/trainer.cpp), under fp32, fp16 loss scaling and two data-parallel ranks; the per-rank compute /
wait timings and the straggler log line (Note [Straggler report]); the flags' validation."""
import json
import math
import os
import re

import numpy as np
import pytest

import tardelli as td
import cli_runner
from tardelli.train import config as C
from tardelli.train import train as train_in_process
from tardelli.train.report import read_metrics

from cli_runner import run

# A tiny dense model; 8 samples per step (1 rank x 8, or 2 ranks x 4).
BASE = ["--synthetic-data", "--vocab-size", "256", "--layers", "2", "--d-model", "64",
        "--heads", "2", "--seq-len", "16", "--micro-batch-size", "8", "--steps", "6",
        "--warmup-steps", "1", "--lr", "1e-2", "--no-progress", "--eval-interval", "0",
        "--log-interval", "1", "--ddp-bucket-mb", "0.05"]
STRAGGLER = "train: straggler rank"

needs_mpi = pytest.mark.skipif(not td.distributed.mpi_available(),
                               reason="built without MPI (TD_WITH_MPI=OFF)")


def train(*args):
    """One process, in this one: the summary dict."""
    return train_in_process(C.parse_config(BASE + list(args))[0], out=lambda *_: None)


def train_ranks(nproc, *args):
    """`nproc` ranks through the launcher: (summary dict, stdout)."""
    p = run(nproc, "tardelli.train", *BASE, *args, timeout=300)
    summary = json.loads([x for x in p.stdout.splitlines() if '"train_end"' in x][-1])
    return summary, p.stdout


def tensors(save, step):
    """The model's and the optimizer's tensors in the checkpoint of `step`, as numpy arrays."""
    st = td.checkpoint.read_global_state(os.path.join(save, td.checkpoint.step_dir_name(step)))
    return {k: v.numpy() for k, v in st.items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ---- configuration ----


def test_fault_flag_defaults():
    # Property: without the new flags a run keeps today's behaviour (raise on a non-finite
    # step), allows 5 consecutive skips when asked to skip, and checks stragglers at 1.2 x.
    cfg, _ = C.parse_config(BASE)
    assert (cfg.on_nonfinite, cfg.max_skipped_steps, cfg.straggler_threshold) == \
        ("raise", 5, 1.2)
    assert C.parse_config(BASE + ["--straggler-threshold", "0"])[0].straggler_threshold == 0
    assert C.inject_loss_steps(C.parse_config(BASE + ["--inject-nonfinite-loss", "3,5@1"])[0]) \
        == {(3, -1), (5, 1)}


@pytest.mark.parametrize("argv, message", [
    (["--max-skipped-steps", "0"], "--max-skipped-steps must be >= 1, got 0"),
    (["--max-skipped-steps", "-2"], "--max-skipped-steps must be >= 1, got -2"),
    (["--straggler-threshold", "-1"], r"--straggler-threshold must be 0 \(off\) or a ratio >= 1"),
    (["--straggler-threshold", "0.5"], r"--straggler-threshold must be 0 \(off\) or a ratio"),
    (["--straggler-threshold", "nan"], r"--straggler-threshold must be 0 \(off\) or a ratio"),
    (["--inject-nonfinite-loss", "x"], "--inject-nonfinite-loss must list STEP or STEP@RANK"),
    (["--inject-nonfinite-loss", "0"], "--inject-nonfinite-loss must list STEP or STEP@RANK"),
    (["--inject-nonfinite-loss", "3@-1"], "--inject-nonfinite-loss must list STEP or STEP@RANK"),
])
def test_bad_fault_flags_are_refused_at_config_time(argv, message):
    # Property: each bad value is refused before any work, with a message naming the flag.
    with pytest.raises(C.ConfigError, match=message):
        C.parse_config(BASE + argv)


def test_unknown_on_nonfinite_value_is_refused(tmp_path, capsys):
    # Property: --on-nonfinite takes raise or skip only: an unknown value is an argparse error
    # (status 2, the choices named) on the command line and a ConfigError naming the flag from
    # a TOML file.
    with pytest.raises(SystemExit) as e:
        C.parse_config(BASE + ["--on-nonfinite", "bogus"])
    assert e.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
    f = tmp_path / "c.toml"
    f.write_text('[train]\non-nonfinite = "bogus"\n')
    with pytest.raises(C.ConfigError, match="--on-nonfinite: unknown value 'bogus' "
                                            r"\(choose from raise, skip\)"):
        C.parse_config(BASE + ["--config", str(f)])


# ---- one process ----


def test_skip_discards_the_update_and_the_step_still_counts(tmp_path, capsys):
    # Property (Note [Non-finite steps]): under --on-nonfinite skip a step whose gradient is
    # inf (step 3) or whose loss is nan (step 5) is skipped: the parameters and AdamW state
    # after it are bitwise those before it (checkpoints of every step), while an applied step
    # changes them. The step still counts: every step has a metrics row, the learning rate
    # follows the clean run's schedule, and the skipped step consumed its batch (step 3's loss,
    # computed before the skip, equals the clean run's). Rows say skipped and carry the running
    # count; one process reports one-element timing lists with no wait, and no straggler line.
    clean, skip = tmp_path / "clean.jsonl", tmp_path / "skip.jsonl"
    save = str(tmp_path / "save")
    train("--metrics-file", str(clean))
    s = train("--on-nonfinite", "skip", "--inject-nonfinite-grad", "3",
              "--inject-nonfinite-loss", "5", "--metrics-file", str(skip), "--save", save,
              "--save-interval", "1")
    ref, rows = read_metrics(clean), read_metrics(skip)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["skipped"] for r in rows] == [False, False, True, False, True, False]
    assert [r["nonfinite_skips"] for r in rows] == [0, 0, 1, 1, 2, 2]
    assert s["nonfinite_skips"] == 2 and s["step"] == 6
    assert not math.isfinite(rows[2]["grad_norm"]) and math.isnan(rows[4]["loss"])
    assert [r["lr"] for r in rows] == [r["lr"] for r in ref]
    assert [r["loss"] for r in rows[:3]] == [r["loss"] for r in ref[:3]]
    assert rows[3]["loss"] != ref[3]["loss"]  # step 3's update is missing from step 4 on
    after = {k: tensors(save, k) for k in range(2, 7)}
    assert_same(after[3], after[2])  # step 3 skipped
    assert_same(after[5], after[4])  # step 5 skipped
    for k in (4, 6):  # applied steps change the parameters
        assert any(not np.array_equal(after[k][n], after[k - 1][n]) for n in after[k])
    for r in rows:
        assert len(r["rank_compute_s"]) == 1 and r["rank_compute_s"][0] > 0
        assert r["rank_wait_s"] == [0.0]
    assert STRAGGLER not in capsys.readouterr().out


def test_raise_stops_at_the_nonfinite_step(tmp_path):
    # Property: under the default --on-nonfinite raise, an inf gradient at step 3 stops the run
    # at step 3 before its update (non-zero exit, the message names the gradient norm and the
    # step; the metrics file ends with step 2), and a nan loss stops it at its step.
    m = tmp_path / "m.jsonl"
    p = run(1, "tardelli.train", *BASE, "--inject-nonfinite-grad", "3", "--metrics-file", m,
            check=False)
    assert p.returncode != 0
    assert re.search(r"train: the gradient norm is (nan|inf) at step 3 \(diverged", p.stderr), \
        p.stderr
    assert [r["step"] for r in read_metrics(m)] == [1, 2]
    with pytest.raises(RuntimeError, match="train: the loss is nan at step 2"):
        train("--inject-nonfinite-loss", "2")


def test_consecutive_skips_are_limited_and_the_count_survives_resume(tmp_path):
    # Property: --max-skipped-steps counts CONSECUTIVE skips: with a limit of 3, skips at steps
    # 1-2, an applied step 3, then skips at 4, 5, 6 stop the run at step 6 (5 skips in all, 3
    # in a row), with a message naming the step and the count; step 6's row is written first.
    # The counters are in the checkpoint: a run stopped after step 5 and resumed stops at step
    # 6 the same way.
    args = ["--on-nonfinite", "skip", "--max-skipped-steps", "3", "--inject-nonfinite-grad",
            "1,2", "--inject-nonfinite-loss", "4,5,6"]
    m = tmp_path / "m.jsonl"
    msg = r"train: step 6: 3 consecutive steps \(steps 4-6\) skipped .*--max-skipped-steps 3"
    with pytest.raises(RuntimeError, match=msg):
        train(*args, "--metrics-file", str(m))
    rows = read_metrics(m)
    assert [r["skipped"] for r in rows] == [True, True, False, True, True, True]
    assert [r["nonfinite_skips"] for r in rows] == [1, 2, 2, 3, 4, 5]
    save, part = str(tmp_path / "save"), tmp_path / "part.jsonl"
    train(*args, "--metrics-file", str(part), "--save", save, "--exit-interval", "5")
    with pytest.raises(RuntimeError, match=msg):
        train(*args, "--metrics-file", str(part), "--save", save, "--resume")
    assert [r["nonfinite_skips"] for r in read_metrics(part)] == [1, 2, 2, 3, 4, 5]


def test_fp16_keeps_the_scaler_for_overflow_and_skips_a_nonfinite_loss(tmp_path):
    # Property: under --dtype fp16 the flag does not change gradient-overflow handling: with an
    # inf gradient at step 2 the skip run's steps 1-3 (loss, scale, skipped, grad norm) equal
    # the default run's, and the scaler's skip is not counted as a non-finite skip. A nan loss
    # at step 4 is skipped by the flag (the scaler, which sees only gradients, would apply it):
    # the tensors after step 4 are those after step 3.
    args = ["--dtype", "fp16", "--inject-nonfinite-grad", "2", "--initial-loss-scale", "1024",
            "--steps", "5"]
    plain, skip = tmp_path / "plain.jsonl", tmp_path / "skip.jsonl"
    save = str(tmp_path / "save")
    train(*args, "--metrics-file", str(plain))
    s = train(*args, "--on-nonfinite", "skip", "--inject-nonfinite-loss", "4", "--metrics-file",
              str(skip), "--save", save, "--save-interval", "1")
    ref, rows = read_metrics(plain), read_metrics(skip)
    key = ("loss", "loss_scale", "skipped", "grad_norm")
    assert [[str(r[k]) for k in key] for r in rows[:3]] == \
        [[str(r[k]) for k in key] for r in ref[:3]]
    assert [r["skipped"] for r in rows] == [False, True, False, True, False]
    assert [r["nonfinite_skips"] for r in rows] == [0, 0, 0, 1, 1]
    assert s["skipped_steps"] == 1 and s["nonfinite_skips"] == 1
    assert_same(tensors(save, 4), tensors(save, 3))


# ---- two ranks ----


@needs_mpi
def test_two_ranks_agree_on_a_nan_loss_of_one_rank(tmp_path):
    # Property (Note [Non-finite steps]): a nan loss on rank 1 only (step 3) makes BOTH ranks
    # skip: the losses of the following steps equal, bit for bit, those of a run where every
    # rank skips step 3 (an inf gradient everywhere); had rank 0 applied its update, the
    # replicas would differ and so would the mean losses. The checkpoint after step 3 equals the
    # one after step 2, and the reported mean loss of step 3 is nan (one rank's nan reaches
    # every rank through the mean).
    one, every = tmp_path / "one.jsonl", tmp_path / "every.jsonl"
    save = str(tmp_path / "save")
    s, _ = train_ranks(2, "--micro-batch-size", "4", "--steps", "5", "--on-nonfinite", "skip",
                       "--inject-nonfinite-loss", "3@1", "--metrics-file", one, "--save", save,
                       "--save-interval", "1")
    train_ranks(2, "--micro-batch-size", "4", "--steps", "5", "--on-nonfinite", "skip",
                "--inject-nonfinite-grad", "3", "--metrics-file", every)
    rows, ref = read_metrics(one), read_metrics(every)
    assert [r["skipped"] for r in rows] == [False, False, True, False, False] == \
        [r["skipped"] for r in ref]
    assert math.isnan(rows[2]["loss"]) and s["nonfinite_skips"] == 1
    assert [rows[i]["loss"] for i in (0, 1, 3, 4)] == [ref[i]["loss"] for i in (0, 1, 3, 4)]
    assert_same(tensors(save, 3), tensors(save, 2))


@needs_mpi
def test_straggler_is_named_and_timings_are_per_rank(tmp_path, monkeypatch):
    # Property (Note [Straggler report]): with rank 1 sleeping 0.3 s in every step's compute
    # (TD_TEST_SLOW_RANK, a test aid), every metrics row holds both ranks' compute and wait
    # times: rank 1 computes >= 0.3 s while rank 0 waits for it (its wait >= 0.2 s, its compute
    # far below rank 1's). The log names rank 1 (never rank 0), at most once per --log-interval
    # (2) steps: at steps 1 and 3 of 4. --straggler-threshold 0 turns the line off.
    monkeypatch.setitem(cli_runner.ENV, "TD_TEST_SLOW_RANK", "1:0.3")
    m = tmp_path / "m.jsonl"
    _, out = train_ranks(2, "--micro-batch-size", "4", "--steps", "4", "--log-interval", "2",
                         "--metrics-file", m)
    rows = read_metrics(m)
    assert len(rows) == 4
    for r in rows:
        compute, wait = r["rank_compute_s"], r["rank_wait_s"]
        assert len(compute) == 2 and len(wait) == 2, r
        assert compute[1] >= 0.3 and wait[0] >= 0.2 and compute[0] < compute[1] / 1.5, r
    lines = [x for x in out.splitlines() if x.startswith(STRAGGLER)]
    assert len(lines) == 2 and all(x.startswith("train: straggler rank 1: compute ")
                                   and x.endswith(" x the median") for x in lines), out
    _, out = train_ranks(2, "--micro-batch-size", "4", "--steps", "2",
                         "--straggler-threshold", "0")
    assert STRAGGLER not in out
