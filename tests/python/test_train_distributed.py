"""python -m tardelli.train under data parallelism (`python -m tardelli.launch --nproc N`):
DP=2 and DP=4, with and without ZeRO-1, against one process with the same global batch;
ZeRO-1 optimizer memory per rank; exact resume of a sharded run; rank-0-only output."""
import json

import numpy as np
import pytest

import tardelli as td

from cli_runner import run

# 8 samples per step: 1 rank x 8, 2 ranks x 4, 4 ranks x 2 (and x 1 with 2 micro-batches).
BASE = ["--synthetic-data", "--vocab-size", "128", "--layers", "2", "--d-model", "64",
        "--heads", "2", "--seq-len", "32", "--global-batch-size", "8", "--steps", "4",
        "--warmup-steps", "1", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
        "--log-interval", "1", "--ddp-bucket-mb", "0.05"]

pytestmark = pytest.mark.skipif(not td.distributed.mpi_available(),
                                reason="built without MPI (TD_WITH_MPI=OFF)")


def train(nproc, *args):
    return run(nproc, "tardelli.train", *BASE, *args, timeout=400).stdout


def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    m = tmp_path_factory.mktemp("ref") / "m.jsonl"
    train(1, "--micro-batch-size", "8", "--metrics-file", str(m))
    return losses(m)


@pytest.mark.parametrize("nproc, mbs, zero", [(2, 4, 0), (2, 4, 1), (4, 2, 0), (4, 1, 1)])
def test_data_parallel_losses_match_one_rank(reference, tmp_path, nproc, mbs, zero):
    # Property: the same global batch split over dp ranks (with gradient accumulation when
    # micro x dp < global) gives the single-process losses: the gradient is the same mean,
    # summed in another order, so losses agree to fp32 rounding (relative 1e-5) over 4 AdamW
    # steps. Only rank 0 prints the summary and writes metrics.
    m = tmp_path / "m.jsonl"
    out = train(nproc, "--micro-batch-size", str(mbs), "--zero", str(zero),
                "--metrics-file", str(m))
    np.testing.assert_allclose(losses(m), reference, rtol=1e-5)
    ends = [json.loads(line) for line in out.splitlines() if '"train_end"' in line]
    assert len(ends) == 1 and ends[0]["dp"] == nproc
    # Memory reporting: each row's maximum over ranks bounds rank 0's own peak, and the summary
    # gives the largest of each over the run.
    rows = [json.loads(line) for line in open(m)]
    assert all(r["peak_mem_bytes_max_rank"] >= r["mem_bytes"] > 0 for r in rows)
    assert ends[0]["peak_mem_bytes"] == max(r["mem_bytes"] for r in rows)
    assert ends[0]["peak_mem_bytes_max_rank"] == max(r["peak_mem_bytes_max_rank"] for r in rows)


def test_zero1_shards_optimizer_state(tmp_path):
    # Property: ZeRO-1 keeps both AdamW moments (8 bytes per parameter; the fp32 parameters
    # are their own masters) only for this rank's 1/dp shard: rank 0's bytes are
    # 8 x params / dp up to the bucket padding (< 1%).
    out = {}
    for n in (2, 4):
        s = train(n, "--micro-batch-size", str(8 // n), "--zero", "1", "--steps", "1")
        out[n] = json.loads([x for x in s.splitlines() if '"train_end"' in x][0])
    for n, s in out.items():
        assert s["optimizer_state_bytes"] == pytest.approx(8 * s["params"] / n, rel=0.01)


def test_zero1_resume_is_exact(tmp_path):
    # Property: a ZeRO-1 run over 2 ranks stopped after step 2 and resumed (each rank reads the
    # boxes of its optimizer shard back) repeats the uninterrupted run's losses bit for bit;
    # every rank wrote its pieces; the same checkpoint resumed by 4 ranks (dp 4, the same
    # global batch) continues the uninterrupted losses to fp32 rounding (the mean gradient is
    # summed in another order).
    args = ["--micro-batch-size", "4", "--zero", "1"]
    full, part, save = tmp_path / "full.jsonl", tmp_path / "part.jsonl", tmp_path / "save"
    train(2, *args, "--metrics-file", str(full))
    train(2, *args, "--metrics-file", str(part), "--save", str(save), "--exit-interval", "2")
    step_dir = save / "step_00000002"
    assert sorted(p.name for p in step_dir.glob("shards.*.safetensors")) == [
        "shards.rank00000.safetensors", "shards.rank00001.safetensors"]
    train(2, *args, "--metrics-file", str(part), "--save", str(save), "--resume")
    assert losses(part) == losses(full)
    four = tmp_path / "four.jsonl"
    (save / "latest").write_text("step_00000002\n")
    train(4, "--micro-batch-size", "2", "--zero", "1", "--metrics-file", str(four), "--save",
          str(save), "--resume")
    np.testing.assert_allclose(losses(four), losses(full)[2:], rtol=1e-5)


@pytest.mark.parametrize("nproc, extra", [(2, ["--zero", "1"]), (2, ["--tp", "2"])])
def test_fp16_overflow_is_skipped_on_every_rank(tmp_path, nproc, extra):
    # Property (Note [fp16 loss scaling]): with gradients sharded (ZeRO-1: each rank holds 1/dp of
    # the averaged gradient) or split over tp, an inf injected at step 2 is seen by every rank
    # through the agreed gradient norm: step 2 is skipped everywhere (its loss scale halves for
    # step 3), the clean steps are applied, and the losses follow the one-rank fp16 run with the
    # same injection (the same mean gradient, summed in another order: the gap is the fp16
    # activations' rounding over 4 steps, 2e-3 relative).
    args = ["--dtype", "fp16", "--inject-nonfinite-grad", "2", "--initial-loss-scale", "1024"]
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    train(1, "--micro-batch-size", "8", *args, "--metrics-file", str(one))
    mbs = "8" if "--tp" in extra else "4"
    train(nproc, "--micro-batch-size", mbs, *args, *extra, "--metrics-file", str(many))
    rows = [json.loads(line) for line in open(many)]
    ref = [json.loads(line) for line in open(one)]
    assert [r["skipped"] for r in rows] == [False, True, False, False] == \
        [r["skipped"] for r in ref]
    assert [r["loss_scale"] for r in rows] == [1024, 1024, 512, 512]
    np.testing.assert_allclose([r["loss"] for r in rows], [r["loss"] for r in ref], rtol=2e-3)
