"""Communication layouts of the data-parallel reduction in `python -m tardelli.train`:
--hierarchical-reduce (Note [Two-level collectives] in include/tardelli/distributed/
hierarchical.h) against the flat reduction, --grad-compression (PowerSGD, top-k with error
feedback: include/tardelli/distributed/grad_compression.h): exact resume, convergence against
uncompressed training, the per-step byte counts in the metrics, and bad flags."""
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
    (["--grad-compression", "topk", "--topk-ratio", "0"], r"--topk-ratio must be in \(0, 1\]"),
    (["--grad-compression", "topk", "--topk-ratio", "1.5"], r"--topk-ratio must be in \(0, 1\]"),
    (["--grad-compression", "powersgd", "--powersgd-rank", "0"], "--powersgd-rank must be >= 1"),
    (["--grad-compression", "powersgd", "--zero", "2"], "not ZeRO-2/3 shards"),
    (["--grad-compression", "topk", "--compression-start-step", "-1"],
     "--compression-start-step must be >= 0"),
    (["--compression-start-step", "5"], "--compression-start-step applies to --grad-compression"),
])
def test_bad_comm_flags(argv, message):
    with pytest.raises(C.ConfigError, match=message):
        C.parse_config(BASE + argv, world_size=4)


@pytest.mark.parametrize("mode", [["powersgd", "--powersgd-rank", "2"],
                                  ["topk", "--topk-ratio", "0.05"]], ids=["powersgd", "topk"])
def test_compressed_resume_is_bitwise(tmp_path, mode):
    # Property: the error-feedback residuals (and PowerSGD's warm-start Q) are in the
    # checkpoint, one file per rank, so a compressed run stopped after step 2 and resumed
    # repeats the uninterrupted run's losses bit for bit; the compressed run sends fewer bytes.
    args = [*BASE, "--steps", "4", "--grad-compression", *mode]
    full, part, save = tmp_path / "full.jsonl", tmp_path / "part.jsonl", tmp_path / "save"
    run(2, "tardelli.train", *args, "--metrics-file", full)
    run(2, "tardelli.train", *args, "--metrics-file", part, "--save", save, "--exit-interval", "2")
    assert (save / "step_00000002" / "compression.rank00001.safetensors").exists()
    run(2, "tardelli.train", *args, "--metrics-file", part, "--save", save, "--resume")
    assert [r["loss"] for r in metrics(part)] == [r["loss"] for r in metrics(full)]
    dense = tmp_path / "dense.jsonl"
    run(2, "tardelli.train", *BASE, "--steps", "1", "--metrics-file", dense)
    assert metrics(full)[0]["dp_comm_bytes"] < metrics(dense)[0]["dp_comm_bytes"] / 3


def test_powersgd_composes_with_the_two_level_reduction(tmp_path):
    # Property: PowerSGD's factor all-reduces go through the DDP's group, so with
    # --hierarchical-reduce they run in two levels: the same losses as flat PowerSGD (rtol 1e-6:
    # the factor sums are reordered) with half of its bytes crossing the 2 simulated nodes.
    args = [*BASE, "--grad-compression", "powersgd", "--powersgd-rank", "2"]
    flat_m, two_m = tmp_path / "flat.jsonl", tmp_path / "two.jsonl"
    run(4, "tardelli.train", *args, "--metrics-file", flat_m, timeout=300)
    run(4, "tardelli.train", *args, "--hierarchical-reduce", "--ranks-per-node", "2",
        "--metrics-file", two_m, timeout=300)
    a, b = metrics(flat_m), metrics(two_m)
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=1e-6)
    for r in b:
        assert r["dp_comm_bytes"] == a[0]["dp_comm_bytes"]
        assert abs(r["cross_node_bytes"] - r["dp_comm_bytes"] / 2) <= 64 * 4, r


def test_powersgd_rank_beyond_a_matrix_is_an_error(tmp_path):
    p = run(2, "tardelli.train", *BASE, "--grad-compression", "powersgd", "--powersgd-rank",
            "100", check=False)
    assert p.returncode != 0
    assert "PowerSGD: rank 100 exceeds a dimension of parameter" in p.stdout + p.stderr


def test_warm_up_steps_reduce_uncompressed(tmp_path):
    # Property (Note [Compression warm-up]): before --compression-start-step the compressors
    # all-reduce plainly, so a run compressing from step 3 repeats the uncompressed run's first
    # two losses bit for bit and then departs from them, sending fewer bytes from step 3 on.
    args = [*BASE, "--steps", "4", "--grad-compression", "powersgd", "--powersgd-rank", "2"]
    warm, dense = tmp_path / "warm.jsonl", tmp_path / "dense.jsonl"
    run(2, "tardelli.train", *args, "--compression-start-step", "2", "--metrics-file", warm)
    run(2, "tardelli.train", *BASE, "--steps", "4", "--metrics-file", dense)
    w, d = metrics(warm), metrics(dense)
    assert [r["loss"] for r in w[:3]] == [r["loss"] for r in d[:3]]  # step 3's loss: before its update
    assert w[3]["loss"] != d[3]["loss"]
    assert [r["dp_comm_bytes"] for r in w[:2]] == [r["dp_comm_bytes"] for r in d[:2]]
    assert w[2]["dp_comm_bytes"] < d[2]["dp_comm_bytes"] / 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Real English text: 3,000 of Debian's fortunes (installed by scripts/setup.sh), byte-level
    BPE of 512 tokens."""
    import glob
    import os
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                   if os.path.isfile(f) and "." not in os.path.basename(f))
    if not files:
        pytest.fail("no corpus in /usr/share/games/fortunes: run scripts/setup.sh (it installs "
                    "Debian's fortunes package)")
    docs = []
    for f in files:
        text = open(f, encoding="utf-8", errors="ignore").read()
        docs += [x.strip("\n") for x in text.split("\n%\n") if x.strip() not in ("", "%")]
    np.random.default_rng(0).shuffle(docs)
    d = tmp_path_factory.mktemp("fortunes")
    (d / "fortunes.txt").write_text("\n%\n".join(docs[:3000]) + "\n")
    run(1, "tardelli.data.preprocess", "--input", d / "fortunes.txt", "--output-prefix",
        d / "fortunes", "--vocab-size", "512", timeout=300)
    return str(d / "fortunes")


CONVERGE = ["--layers", "2", "--d-model", "64", "--heads", "2", "--seq-len", "32",
            "--micro-batch-size", "4", "--global-batch-size", "16", "--steps", "200",
            "--warmup-steps", "10", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
            "--log-interval", "50", "--split", "100,0,0"]


@pytest.mark.parametrize("nproc", [2, 4])
def test_compressed_training_converges_like_uncompressed(corpus, tmp_path, nproc):
    # Property (issue 26's target for PowerSGD): a small GPT trained on English text at dp 2
    # and 4 for 200 steps with PowerSGD rank 4 (error feedback, compressing from step 10, where
    # the LR warm-up ends: Note [Compression warm-up]) ends within 2% of the uncompressed final
    # loss (mean of the last 10 steps; measured +1.4% at both sizes, AMD EPYC), sending under a
    # fifth of the bytes. Top-k 1% with error feedback learns (final under 90% of the first
    # loss; measured 5.2 vs 6.23 at the start) but ends ~15% above: under AdamW a coordinate
    # sent once in ~100 steps moves a few learning rates, not ~100 (docs/distributed.md), so
    # issue 26's 2% is not met for top-k and is reported, not asserted.
    final, sent = {}, {}
    warm = ["--compression-start-step", "10"]
    for name, extra in (("none", []),
                        ("powersgd", ["--grad-compression", "powersgd", "--powersgd-rank", "4",
                                      *warm]),
                        ("topk", ["--grad-compression", "topk", "--topk-ratio", "0.01", *warm])):
        m = tmp_path / f"{name}.jsonl"
        run(nproc, "tardelli.train", "--data", corpus, *CONVERGE, *extra, "--metrics-file", m,
            timeout=600)
        rows = metrics(m)
        final[name] = float(np.mean([r["loss"] for r in rows[-10:]]))
        sent[name] = rows[-1]["dp_comm_bytes"]
    start = metrics(tmp_path / "none.jsonl")[0]["loss"]
    assert final["none"] < 0.8 * start, final  # it learned
    assert final["powersgd"] <= 1.02 * final["none"], final
    assert final["topk"] < 0.9 * start, (final, start)
    for name in ("powersgd", "topk"):
        assert sent[name] < 0.2 * sent["none"], (name, sent)
    print(f"convergence dp {nproc}: start {start:.3f}, final " +
          ", ".join(f"{k} {v:.3f}" for k, v in final.items()))
