"""--async-save (Note [Async save] in include/tardelli/train/train_state.h): the checkpoints equal a
synchronous run's, the step is blocked only for the host snapshot, and a process killed while
the background writer runs leaves the previous checkpoint intact and resumable."""
import signal
import sys

import numpy as np
import pytest

import tardelli as td

from cli_runner import ENV, kill_at_async_save, metrics, run

BASE = ["--synthetic-data", "--vocab-size", "301", "--layers", "2", "--d-model", "32",
        "--heads", "4", "--seq-len", "16", "--global-batch-size", "8", "--micro-batch-size",
        "2", "--steps", "4", "--warmup-steps", "1", "--lr", "3e-3", "--no-progress",
        "--eval-interval", "0", "--log-interval", "1", "--save-interval", "1"]


def state(save, step):
    path = save / td.checkpoint.step_dir_name(step)
    meta = td.checkpoint.CheckpointReader(str(path)).meta()
    meta.pop("train")  # the flags: --async-save differs
    files = sorted(f.name for f in path.iterdir())
    return files, meta, td.checkpoint.read_global_state(str(path))


@pytest.mark.skipif(not td.distributed.mpi_available(), reason="built without MPI")
def test_async_save_writes_what_a_synchronous_save_writes(tmp_path):
    # Property: with --async-save every step's checkpoint has the same files, metadata (but
    # the flags) and tensors, bit for bit, as the synchronous run's; the losses are the same;
    # every saving step reports the time the save blocked it.
    runs = {}
    for name, extra in (("sync", []), ("async", ["--async-save"])):
        save, m = tmp_path / name, tmp_path / f"{name}.jsonl"
        run(2, "tardelli.train", *BASE, *extra, "--save", save, "--metrics-file", m)
        runs[name] = (save, metrics(m))
    (s_save, s_rows), (a_save, a_rows) = runs["sync"], runs["async"]
    assert [r["loss"] for r in s_rows] == [r["loss"] for r in a_rows]
    assert all(r["save_blocked_s"] >= 0 for r in s_rows + a_rows)
    for step in range(1, 5):
        fs, ms, ts = state(s_save, step)
        fa, ma, ta = state(a_save, step)
        assert fs == fa and ms == ma, step
        assert sorted(ts) == sorted(ta)
        for k in ts:
            np.testing.assert_array_equal(ts[k].numpy(), ta[k].numpy(), err_msg=f"{step} {k}")
    assert td.checkpoint.find_latest(str(a_save)).endswith("step_00000004")


def test_kill_during_background_write_keeps_the_previous_checkpoint(tmp_path):
    # Property: a process SIGKILLed while its background writer is writing step 2 (slowed by
    # the test hook) leaves step 1 as the latest complete checkpoint, verified by its CRCs, and
    # no step-2 directory; resuming from it repeats the uninterrupted run's losses bitwise.
    save, m = tmp_path / "save", tmp_path / "m.jsonl"
    env = dict(ENV, TD_TEST_ASYNC_SAVE_DELAY="3", PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "tardelli.train", *BASE, "--async-save", "--save", str(save),
            "--metrics-file", str(m)]
    code, seen = kill_at_async_save(argv, env)
    assert code == -signal.SIGKILL, "".join(seen)
    assert any("saved" in x and "step_00000001" in x for x in seen), "".join(seen)
    latest = td.checkpoint.find_latest(str(save))
    assert latest.endswith("step_00000001")
    td.checkpoint.CheckpointReader(latest).verify()
    assert not (save / "step_00000002").exists()
    run(1, "tardelli.train", *BASE, "--async-save", "--save", save, "--metrics-file", m,
        "--resume")
    full = tmp_path / "full.jsonl"
    run(1, "tardelli.train", *BASE, "--metrics-file", full)
    assert [r["loss"] for r in metrics(m)] == [r["loss"] for r in metrics(full)]
    assert [r["step"] for r in metrics(m)] == [1, 2, 3, 4]
