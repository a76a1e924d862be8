"""Communication layouts of the data-parallel reduction in `python -m tardelli.train`:
--hierarchical-reduce (Note [Two-level collectives] in include/tardelli/distributed/
hierarchical.h) against the flat reduction, and the per-step byte counts in the metrics."""
import numpy as np
import pytest

import tardelli as td
from tardelli.train import config as C

from cli_runner import metrics, run

BASE = ["--synthetic-data", "--vocab-size", "128", "--layers", "2", "--d-model", "64",
        "--heads", "2", "--seq-len", "16", "--global-batch-size", "8", "--micro-batch-size",
        "2", "--steps", "3", "--warmup-steps", "1", "--lr", "3e-3", "--no-progress",
        "--eval-interval", "0", "--log-interval", "1", "--ddp-bucket-mb", "0.05"]

pytestmark = pytest.mark.skipif(not td.distributed.mpi_available(),
                                reason="built without MPI (TD_WITH_MPI=OFF)")


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    d = tmp_path_factory.mktemp("flat")
    out = {}
    for zero in (0, 1, 3):
        m = d / f"z{zero}.jsonl"
        run(4, "tardelli.train", *BASE, "--zero", str(zero), "--metrics-file", m, timeout=300)
        out[zero] = metrics(m)
    return out


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_hierarchical_reduce_matches_flat(flat, tmp_path, zero):
    # Property: 4 ranks as 2 simulated nodes of 2: the two-level reductions (all-reduce, ZeRO's
    # reduce-scatter and all-gather, ZeRO-3's per-block gathers) give the flat run's losses and
    # grad norms to fp32 rounding (rtol 1e-5: the sums run in another order); with plain DDP
    # the cross-node step carries half of the reduction's bytes (1 / ranks_per_node).
    m = tmp_path / "m.jsonl"
    run(4, "tardelli.train", *BASE, "--zero", str(zero), "--hierarchical-reduce",
        "--ranks-per-node", "2", "--metrics-file", m, timeout=300)
    got, want = metrics(m), flat[zero]
    for k in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[k] for r in got], [r[k] for r in want], rtol=1e-5,
                                   err_msg=k)
    for r in got:
        assert r["dp_comm_bytes"] > 0 and 0 < r["cross_node_bytes"] < r["dp_comm_bytes"]
        if zero == 0:
            # Each bucket's cross-node all-reduce takes half of it (padded to the node size).
            assert abs(r["cross_node_bytes"] - r["dp_comm_bytes"] / 2) <= 64 * 4, r
    assert all("cross_node_bytes" not in r and r["dp_comm_bytes"] > 0 for r in want)


@pytest.mark.parametrize("argv, message", [
    (["--ranks-per-node", "2"], "--ranks-per-node applies to --hierarchical-reduce"),
    (["--hierarchical-reduce", "--ranks-per-node", "-1"], "--ranks-per-node must be >= 0"),
])
def test_bad_comm_flags(argv, message):
    with pytest.raises(C.ConfigError, match=message):
        C.parse_config(BASE + argv, world_size=4)
