"""Layout-free checkpoints (Note [Layout-free checkpoints] in include/tardelli/train/train_state.h):
a run saved at tp 2 x pp 2 resumes at one rank, at dp 4 with ZeRO-1, at pp 4, and back, each
continuing the uninterrupted run's losses; `python -m tardelli.checkpoint convert` reshards
offline and a round trip gives the tensors back bit for bit; `inspect` prints a checkpoint; bad
checkpoints fail with errors naming the file."""
import json
import shutil

import numpy as np
import pytest

import tardelli as td

from cli_runner import metrics, run

# gpt2 (tied table: the last stage holds a copy), vocabulary 301 (padded under tp), 4 layers
# (pp 4 holds one each), no dropout (dropout streams are per layout), eps 1e-3 (Adam's update
# is then smooth in the gradient, so fp32 reordering stays at rounding level, as in
# tp_gpt_worker.py). 8 samples a step whatever the layout.
BASE = ["--synthetic-data", "--vocab-size", "301", "--layers", "4", "--d-model", "32",
        "--heads", "4", "--seq-len", "16", "--global-batch-size", "8", "--micro-batch-size",
        "2", "--steps", "4", "--warmup-steps", "1", "--lr", "3e-3", "--eps", "1e-3",
        "--no-progress", "--eval-interval", "0", "--log-interval", "1"]
TP2PP2 = ["--tp", "2", "--pp", "2"]

pytestmark = pytest.mark.skipif(not td.distributed.mpi_available(),
                                reason="built without MPI (TD_WITH_MPI=OFF)")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The uninterrupted tp 2 x pp 2 run's metrics, and the same run stopped after step 2."""
    d = tmp_path_factory.mktemp("reshard")
    run(4, "tardelli.train", *BASE, *TP2PP2, "--metrics-file", d / "full.jsonl", timeout=300)
    run(4, "tardelli.train", *BASE, *TP2PP2, "--save", d / "save", "--exit-interval", "2",
        timeout=300)
    return {"dir": d, "full": metrics(d / "full.jsonl"), "ckpt": d / "save" / "step_00000002"}


def copy_save(saved, dst):
    """A save directory holding only the step-2 checkpoint."""
    shutil.copytree(saved["ckpt"], dst / "step_00000002")
    (dst / "latest").write_text("step_00000002\n")
    return dst


def close(got, want, what):
    for k in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[k] for r in got], [r[k] for r in want], rtol=1e-5,
                                   err_msg=f"{what}: {k}")


@pytest.mark.parametrize("nproc, layout", [
    (1, []),
    (4, ["--zero", "1"]),
    (4, ["--pp", "4"]),
    (4, ["--tp", "4", "--zero", "2"]),
    (4, ["--pp", "2", "--vpp", "2", "--schedule", "interleaved"]),
    (4, ["--cp", "2", "--zero", "1"]),
    (2, ["--zero", "3"]),
], ids=["one-rank", "dp4-zero1", "pp4", "tp4-zero2", "pp2-vpp2", "cp2xdp2-zero1", "dp2-zero3"])
def test_resume_at_another_layout_continues_the_run(saved, tmp_path, nproc, layout):
    # Property: the step-2 checkpoint of tp 2 x pp 2 resumed at another layout (each rank
    # reads the boxes of its shards, ZeRO shards included, from the pieces tp 2 x pp 2 wrote)
    # continues with the uninterrupted run's losses and grad norms to fp32 rounding (rtol 1e-5:
    # the layouts sum in other orders; a misplaced shard or moment changes them at 1e-2).
    save = copy_save(saved, tmp_path / "save")
    m = tmp_path / "m.jsonl"
    p = run(nproc, "tardelli.train", *BASE, *layout, "--save", save, "--resume",
            "--metrics-file", m, timeout=300)
    assert "resharded from another layout" in p.stdout
    got = metrics(m)
    assert [r["step"] for r in got] == [3, 4]
    close(got, saved["full"][2:], " ".join(layout) or "one rank")


def test_resume_elsewhere_and_back(saved, tmp_path):
    # Property: one step at one rank, then back at tp 2 x pp 2 for the last: the run's losses
    # still follow the uninterrupted run (and the step-3 checkpoint written by one rank is read
    # by four).
    save = copy_save(saved, tmp_path / "save")
    m = tmp_path / "m.jsonl"
    run(1, "tardelli.train", *BASE, "--save", save, "--resume", "--metrics-file", m,
        "--exit-interval", "3", timeout=300)
    run(4, "tardelli.train", *BASE, *TP2PP2, "--save", save, "--resume", "--metrics-file", m,
        timeout=300)
    got = metrics(m)
    assert [r["step"] for r in got] == [3, 4]
    close(got, saved["full"][2:], "one rank then tp2 x pp2")


def test_convert_round_trip_is_bitwise_and_inspect(saved, tmp_path):
    # Property: `convert` loads and saves without computing, so tp 2 x pp 2 -> dp 4 ZeRO-1 ->
    # tp 2 x pp 2 gives every global tensor (parameters, moments) bit for bit, with the step,
    # data position and optimizer step kept; `inspect` reports the layout and the tensors.
    a = saved["ckpt"]
    run(4, "tardelli.checkpoint", "convert", a, tmp_path / "b", "--tp", "1", "--pp", "1",
        "--zero", "1", timeout=300)
    run(4, "tardelli.checkpoint", "convert", tmp_path / "b", tmp_path / "c", "--tp", "2",
        "--pp", "2", "--zero", "0", timeout=300)
    want = td.checkpoint.read_global_state(a)
    for d in ("b", "c"):
        step = td.checkpoint.find_latest(str(tmp_path / d))
        assert step.endswith("step_00000002")
        got = td.checkpoint.read_global_state(step)
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k].numpy(), want[k].numpy(), err_msg=f"{d}: {k}")
        meta = td.checkpoint.CheckpointReader(step).meta()
        assert meta["optimizer"]["step"] == 2 and meta["data"]["consumed_samples"] == 16
    assert td.checkpoint.CheckpointReader(str(tmp_path / "b" / "step_00000002")).meta()[
        "parallel"]["zero"] == 1
    out = run(1, "tardelli.checkpoint", "inspect", tmp_path / "c").stdout
    assert "step 2, format 2" in out and "tp 2, pp 2" in out, out
    assert "h.0.attn.c_attn.weight.exp_avg" in out and "[96, 32]" in out, out
    d = json.loads(run(1, "tardelli.checkpoint", "inspect", a, "--json").stdout)
    assert d["parallel"]["world"] == 4 and len(d["tensors"]) == len(want)


def test_bad_checkpoints_fail_naming_the_file(saved, tmp_path):
    # Property: another model shape is refused naming the differing field; a damaged shard
    # file or index names the file (CRC); --resume with no complete checkpoint names the
    # directory and its contents; a shard file whose pieces are missing names the tensor; in
    # each case the checkpoint is left as it was and nothing new is written.
    save = copy_save(saved, tmp_path / "save")
    p = run(1, "tardelli.train", *[x if x != "32" else "64" for x in BASE], "--save", save,
            "--resume", check=False)
    assert p.returncode == 2 and "d_model" in p.stderr, p.stderr
    for name, damage in (("shards.rank00001.index.json", b"#"),
                         ("shards.rank00002.safetensors", b"\0" * 64)):
        bad = copy_save(saved, tmp_path / f"bad_{name}")
        f = bad / "step_00000002" / name
        f.write_bytes(damage + f.read_bytes()[len(damage):])
        p = run(1, "tardelli.train", *BASE, "--save", bad, "--resume", check=False)
        assert p.returncode != 0 and name in p.stderr, p.stderr
        assert sorted(x.name for x in bad.iterdir()) == ["latest", "step_00000002"]
    # Nothing to resume: an error naming the directory and what it holds.
    empty = tmp_path / "empty"
    (empty / "step_00000002.tmp").mkdir(parents=True)
    p = run(1, "tardelli.train", *BASE, "--save", empty, "--resume", check=False)
    assert p.returncode == 2 and "no complete checkpoint under" in p.stderr and \
        "step_00000002.tmp" in p.stderr, p.stderr
    assert sorted(x.name for x in empty.iterdir()) == ["step_00000002.tmp"]
    # A rank's data without its pieces: the index of rank 3 emptied (a consistent manifest).
    r = td.checkpoint.CheckpointReader(saved["ckpt"])
    missing = tmp_path / "missing"
    w = td.checkpoint.CheckpointWriter(str(missing / "step_00000002"))
    for f in r.files():
        if f["name"] == "shards.rank00003.index.json":
            w.write_bytes(f["name"], b'{"pieces": []}\n')
        else:
            w.write_bytes(f["name"], r.read_bytes(f["name"]))
    meta = r.meta()
    for k in ("format", "version", "manifests"):
        meta.pop(k)
    w.commit(meta)
    (missing / "latest").write_text("step_00000002\n")
    p = run(1, "tardelli.train", *BASE, "--save", missing, "--resume", check=False)
    assert p.returncode == 2 and "cover" in p.stderr and "missing or incomplete" in p.stderr, \
        p.stderr
