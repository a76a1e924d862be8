"""`python -m tardelli.train` with every group's sends and receives matched by tag over an
untagged, ordered transport (Note [Tag matching] in include/tardelli/distributed/tag_matching.h):
the matching that NCCL communicators use (Note [NCCL point-to-point]), here through its MPI
stand-in (TD_TEST_TAG_MATCHED_P2P=1), so the pipeline schedules' and the context-parallel ring's
traffic goes through it on CPU ranks."""
import pytest

import tardelli as td

from cli_runner import ENV, train_losses

pytestmark = pytest.mark.skipif(not td.distributed.mpi_available(),
                                reason="built without MPI (TD_WITH_MPI=OFF)")

BASE = ["--synthetic-data", "--vocab-size", "128", "--layers", "4", "--d-model", "64",
        "--heads", "4", "--seq-len", "16", "--global-batch-size", "8", "--steps", "3",
        "--warmup-steps", "1", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
        "--log-interval", "1"]


def losses(tmp_path, name, nproc, flags, matched):
    env = dict(ENV, TD_TEST_TAG_MATCHED_P2P="1" if matched else "0")
    return train_losses(tmp_path / f"{name}_{int(matched)}.jsonl", nproc, [*BASE, *flags], env,
                        "mpi-tag-matched" if matched else "mpi")


@pytest.mark.parametrize("name, nproc, flags", [
    ("pp2_zb", 2, ["--micro-batch-size", "2", "--pp", "2", "--schedule", "zb"]),
    ("pp2_interleaved_tp2", 4, ["--micro-batch-size", "2", "--pp", "2", "--vpp", "2",
                                "--schedule", "interleaved", "--tp", "2"]),
    ("cp2_ring", 2, ["--micro-batch-size", "4", "--cp", "2", "--cp-comm", "ring"]),
])
def test_tag_matched_groups_train_bitwise_like_mpi_tags(tmp_path, name, nproc, flags):
    # Property: the matcher delivers each message to the receive MPI's tags would, so every
    # loss equals the plain MPI run's bit for bit (a message paired with the wrong receive would
    # change the losses or fail with a count error).
    assert losses(tmp_path, name, nproc, flags, True) == losses(tmp_path, name, nproc, flags,
                                                                False)
