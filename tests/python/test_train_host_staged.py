"""`python -m tardelli.train` with its groups host-staged (include/tardelli/distributed/
host_staged.h; Note [Ranks on GPUs] in src/train/trainer.cpp): the path GPU ranks
take when several share a device. Here CPU ranks stage their tensors the same way
(TD_TEST_STAGE_HOST_TENSORS=1), so the staging under every collective the layouts use (DDP
buckets, ZeRO-1 and ZeRO-3, tensor/sequence-parallel layers, pipeline send/recv) is exercised
without a GPU; benchmarks/gpu/layout_parity.py runs the same layouts on CUDA tensors."""
import pytest

import tardelli as td

from cli_runner import ENV, train_losses

pytestmark = pytest.mark.skipif(not td.distributed.mpi_available(),
                                reason="built without MPI (TD_WITH_MPI=OFF)")

BASE = ["--synthetic-data", "--vocab-size", "128", "--layers", "4", "--d-model", "64",
        "--heads", "4", "--seq-len", "16", "--global-batch-size", "8", "--steps", "3",
        "--warmup-steps", "1", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
        "--log-interval", "1", "--ddp-bucket-mb", "0.05"]


def losses(tmp_path, name, nproc, flags, staged):
    env = dict(ENV, TD_TEST_STAGE_HOST_TENSORS="1" if staged else "0")
    return train_losses(tmp_path / f"{name}_{int(staged)}.jsonl", nproc, [*BASE, *flags], env,
                        "mpi-staged" if staged else "mpi")


@pytest.mark.parametrize("name, nproc, flags", [
    ("dp2_zero1", 2, ["--micro-batch-size", "4", "--zero", "1"]),
    ("dp2_zero3", 2, ["--micro-batch-size", "4", "--zero", "3"]),
    ("tp2_sp", 2, ["--micro-batch-size", "8", "--tp", "2", "--sequence-parallel"]),
    ("cp2_ring", 2, ["--micro-batch-size", "8", "--cp", "2", "--cp-comm", "ring"]),
    ("pp2_interleaved", 2, ["--micro-batch-size", "2", "--pp", "2", "--vpp", "2",
                            "--schedule", "interleaved"]),
])
def test_staged_groups_train_bitwise_like_plain_ones(tmp_path, name, nproc, flags):
    # Property (Note [Host staging]): staging only copies bytes in and out, in the same order of
    # operations, so every loss equals the unstaged run's bit for bit.
    assert losses(tmp_path, name, nproc, flags, True) == losses(tmp_path, name, nproc, flags,
                                                                 False)
