"""Mixture of experts from Python and `python -m tardelli.train` (docs/moe.md): the bindings,
the CLI's MoE flags and their validation, the per-step MoE metrics, data parallelism (ZeRO 0, 1,
2 and 3) against one process with the same micro-batches, the router-bias update summed over dp
ranks, exact resume with the expert biases in the checkpoint, and expert parallelism (--ep)
alone and with dp, tp and pp against one process."""
import json
from pathlib import Path

import numpy as np
import pytest

import tardelli as td
from tardelli.train import config as C

from cli_runner import make_corpus, run

# 8 samples per step in micro-batches of 4: one rank accumulates 2, two ranks take one each, so
# every forward (and its auxiliary losses and capacity) sees the same tokens in both layouts.
BASE = ["--synthetic-data", "--vocab-size", "256", "--layers", "2", "--d-model", "64",
        "--heads", "2", "--seq-len", "16", "--micro-batch-size", "4", "--global-batch-size",
        "8", "--steps", "4", "--warmup-steps", "1", "--lr", "1e-2", "--no-progress",
        "--eval-interval", "0", "--log-interval", "1", "--ddp-bucket-mb", "0.05",
        "--num-experts", "4", "--moe-top-k", "2", "--moe-z-loss-coeff", "1e-3",
        "--moe-router-bias-update-rate", "1e-2"]
MOE_KEYS = ("moe_aux_loss", "moe_z_loss", "moe_max_load", "moe_mean_load", "moe_dropped_tokens")
BIAS = "h.0.mlp.router.expert_bias"


def train(nproc, *args):
    p = run(nproc, "tardelli.train", *BASE, *args, timeout=400)
    return json.loads([x for x in p.stdout.splitlines() if '"train_end"' in x][-1])


def rows(path):
    return [json.loads(line) for line in open(path)]


def biases(save, step):
    from tardelli.train.state import assemble_full_state
    r = td.checkpoint.CheckpointReader(str(Path(save) / td.checkpoint.step_dir_name(step)))
    t = assemble_full_state(r)  # model.safetensors, or the tp / pp shard files put together
    return {n: np.array(v.tolist()) for n, v in t.items() if n.endswith("expert_bias")}


def small_config(**kw):
    return td.models.GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=2, d_model=64,
                               num_experts=4, moe_top_k=2, **kw)


def test_python_api_stats_bias_and_buffers():
    # Property: the MoE fields round-trip through GPTConfig (and a dense config keeps its
    # old dict); a training forward fills moe_stats(), whose token counts add up to tokens x
    # top_k per layer; the pending router load can be replaced (as the trainer does with the
    # dp sum) and drives update_moe_router_bias(); expert_bias is a buffer of state_dict().
    cfg = small_config(moe_router_bias_update_rate=0.5, moe_layer_freq=2)
    assert cfg.num_experts == 4 and cfg.to_dict()["moe_router_bias_update_rate"] == 0.5
    assert td.models.GPTConfig(**cfg.to_dict()) == cfg
    assert "num_experts" not in td.models.GPTConfig(n_layer=2).to_dict()
    assert td.checkpoint.config_to_dict(cfg) == cfg.to_dict()
    model = td.models.GPT(cfg).train()
    assert model.num_moe_layers == 1 and BIAS in model.state_dict()
    assert "h.1.mlp.router.expert_bias" not in model.state_dict()  # freq 2: block 1 dense
    x = td.randint(0, 256, (2, 16), generator=td.Generator(1))
    model(x, x).backward()
    st = model.moe_stats()
    (layer,) = st["layers"]
    assert layer["layer"] == 0 and layer["forwards"] == 1 and layer["tokens"] == 32
    assert sum(layer["tokens_per_expert"]) == 32 * 2 and layer["dropped"] == 0
    assert layer["max_load"] == max(layer["tokens_per_expert"]) and st["aux_loss"] > 0
    assert model.moe_router_load == [layer["tokens_per_expert"]]
    model.moe_router_load = [[10, 0, 5, 5]]
    model.update_moe_router_bias()
    assert model.state_dict()[BIAS].tolist() == [-0.5, 0.5, 0.0, 0.0]
    assert model.moe_router_load == [[0, 0, 0, 0]]
    model.reset_moe_stats()
    assert model.moe_stats()["layers"][0]["forwards"] == 0
    with pytest.raises(td.TardelliError, match="2 layers given"):
        model.moe_router_load = [[0] * 4, [0] * 4]
    with td.no_grad():  # evaluation: dropless, the cross-entropy alone, no statistics
        model.eval()
        model(x, x)
    assert model.moe_stats()["layers"][0]["forwards"] == 0


@pytest.mark.parametrize("argv, world, message", [
    (["--moe-top-k", "5"], 1, r"--moe-top-k 5 must be in \[1, --num-experts 4\]"),
    (["--num-experts", "-1"], 1, "--num-experts must be >= 0"),
    (["--moe-aux-loss-coeff", "-0.1"], 1, "--moe-aux-loss-coeff must be a number >= 0"),
    (["--moe-capacity-factor", "-1"], 1, "--moe-capacity-factor must be a number >= 0"),
    (["--moe-layer-freq", "0"], 1, "--moe-layer-freq must be >= 1"),
    (["--tp", "2", "--sequence-parallel"], 2, "--num-experts 4 with --sequence-parallel"),
    (["--cp", "2"], 2, "--num-experts 4 with --cp 2"),
    (["--ep", "3"], 3, "--num-experts 4 is not divisible by --ep 3"),
    (["--ep", "2"], 1, "--ep 2 does not divide the data-parallel size 1"),
    (["--ep", "2", "--tp", "2"], 2, "--ep 2 does not divide the data-parallel size 1"),
    (["--ep", "2", "--zero", "3"], 2, "--ep 2 with --zero 3"),
    (["--ep", "0"], 1, "--ep must be >= 1"),
    (["--num-experts", "0", "--ep", "2"], 2, "--ep 2: expert parallelism needs a mixture"),
])
def test_bad_moe_flags_are_refused_at_config_time(argv, world, message):
    with pytest.raises(C.ConfigError, match=message):
        C.parse_config(BASE + argv, world_size=world)


def test_moe_config_from_toml(tmp_path):
    f = tmp_path / "moe.toml"
    f.write_text("[moe]\nnum-experts = 8\nmoe_top_k = 1\nmoe-capacity-factor = 1.25\n")
    cfg, _ = C.parse_config(["--config", str(f), "--synthetic-data", "--vocab-size", "256"])
    assert (cfg.num_experts, cfg.moe_top_k, cfg.moe_capacity_factor) == (8, 1, 1.25)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-process run: metrics rows and the final checkpoint's expert biases."""
    d = tmp_path_factory.mktemp("ref")
    summary = train(1, "--metrics-file", str(d / "m.jsonl"), "--save", str(d / "save"))
    return {"rows": rows(d / "m.jsonl"), "biases": biases(d / "save", 4), "summary": summary}


def test_cli_moe_run_reports_metrics_and_learns(reference, tmp_path):
    # Property: every row carries the MoE metrics with dropless counts, the load ratios are
    # >= 1, `loss` is the cross-entropy (about ln 256 on uniform tokens; the auxiliary terms are
    # reported apart), and the bias update moved the expert biases away from 0.
    rs = reference["rows"]
    for r in rs:
        assert abs(r["loss"] - np.log(256)) < 0.05, r
        assert all(k in r for k in MOE_KEYS), r
        assert r["moe_dropped_tokens"] == 0 and r["moe_aux_loss"] > 0 and r["moe_z_loss"] > 0
        assert r["moe_max_load"] >= r["moe_mean_load"] >= 1.0
    assert any(np.any(b != 0) for b in reference["biases"].values())
    assert reference["summary"]["moe_layers"] == 2
    # A capacity below the routed load drops token-slots, and is counted.
    m = tmp_path / "cap.jsonl"
    train(1, "--steps", "1", "--moe-capacity-factor", "0.5", "--metrics-file", str(m))
    assert rows(m)[0]["moe_dropped_tokens"] > 0


def test_full_recompute_counts_each_forward_once(reference, tmp_path):
    # Property: --recompute full runs each block again in backward; the statistics (and so
    # the metrics and the bias update) count the forward only, so nothing changes.
    m = tmp_path / "m.jsonl"
    train(1, "--steps", "2", "--recompute", "full", "--metrics-file", str(m))
    for got, ref in zip(rows(m), reference["rows"][:2]):
        for k in ("loss",) + MOE_KEYS:
            assert got[k] == pytest.approx(ref[k], rel=1e-6), k


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small regular corpus, byte-level BPE of 300 tokens (cli_runner.make_corpus)."""
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=0)


def test_moe_loss_falls_on_a_corpus(corpus, tmp_path):
    # Property: an MoE model (top-2 of 4 experts in every block, one shared expert, z-loss and
    # the bias update on) learns a regular corpus: the cross-entropy falls well below its start
    # (about ln 300 = 5.7), and the validation loss (dropless, the cross-entropy alone) is
    # comparable with it.
    from tardelli.train import trainer
    m = tmp_path / "m.jsonl"
    cfg, _ = C.parse_config(
        BASE[3:] +  # without --synthetic-data --vocab-size 256
        ["--data", str(corpus), "--split", "90,10,0", "--steps", "30", "--lr", "3e-3",
         "--moe-shared-experts", "1", "--eval-interval", "30", "--eval-steps", "2",
         "--metrics-file", str(m)])
    s = trainer.train(cfg, out=lambda *_: None)
    rs = rows(m)
    first = np.mean([r["loss"] for r in rs[:3]])
    last = np.mean([r["loss"] for r in rs[-3:]])
    assert first > 5.0 and last < 0.7 * first, (first, last)
    assert s["val_loss"] < 0.8 * first and s["moe_layers"] == 2


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_data_parallel_moe_matches_one_rank(reference, tmp_path, zero):
    # Property: two dp ranks with one micro-batch each follow the one-rank run that accumulates
    # the same two micro-batches: losses and aux losses to fp32 rounding, the global-batch
    # load metrics and dropped counts exactly, and the expert biases (updated from the router
    # loads summed over dp, Note [MoE bias over dp]) equal on both ranks and to the one-rank
    # run's, bit for bit.
    m, save = tmp_path / "m.jsonl", tmp_path / "save"
    summary = train(2, "--zero", str(zero), "--metrics-file", str(m), "--save", str(save))
    got, ref = rows(m), reference["rows"]
    for k in ("loss", "moe_aux_loss", "moe_z_loss"):
        np.testing.assert_allclose([r[k] for r in got], [r[k] for r in ref], rtol=1e-5,
                                   err_msg=k)
    for k in ("moe_max_load", "moe_mean_load", "moe_dropped_tokens"):
        assert [r[k] for r in got] == [r[k] for r in ref], k
    assert summary["moe_bias_replicated"] is True and summary["dp"] == 2
    b = biases(save, 4)
    assert b.keys() == reference["biases"].keys()
    for n in b:
        np.testing.assert_array_equal(b[n], reference["biases"][n])


@pytest.mark.parametrize("nproc, zero", [(1, 0), (2, 0), (2, 1)])
def test_moe_resume_is_exact(reference, tmp_path, nproc, zero):
    # Property (Note [Exact resume]): stopped after step 2 and resumed, the run repeats the
    # uninterrupted losses bit for bit: the expert biases are saved with the parameters.
    m, save = tmp_path / "m.jsonl", tmp_path / "save"
    args = ["--zero", str(zero), "--metrics-file", str(m), "--save", str(save)]
    train(nproc, *args, "--exit-interval", "2")
    assert BIAS in td.checkpoint.PieceIndex(str(save / "step_00000002")).names()
    train(nproc, *args, "--resume")
    got = rows(m)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    full = reference["rows"]
    if nproc == 1:
        assert [r["loss"] for r in got] == [r["loss"] for r in full]
    else:
        uninterrupted = tmp_path / "full.jsonl"
        train(nproc, "--zero", str(zero), "--metrics-file", str(uninterrupted))
        assert [r["loss"] for r in got] == [r["loss"] for r in rows(uninterrupted)]
    for n, b in biases(save, 4).items():
        np.testing.assert_array_equal(b, reference["biases"][n])


# Expert parallelism: micro-batches of 2, 8 samples a step, so every layout below (up to dp 4)
# runs the same 2-sample forwards as the one-process run that accumulates 4 of them; each
# forward's auxiliary losses and loads then match too.
EP = ["--micro-batch-size", "2", "--steps", "3"]


@pytest.fixture(scope="module")
def ep_reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ep_ref")
    train(1, *EP, "--metrics-file", str(d / "m.jsonl"), "--save", str(d / "save"))
    return {"rows": rows(d / "m.jsonl"), "biases": biases(d / "save", 3)}


@pytest.mark.parametrize("nproc, layout", [
    (2, ["--ep", "2"]),
    (2, ["--ep", "2", "--zero", "1"]),
    (4, ["--ep", "4"]),
    (4, ["--ep", "2", "--zero", "1"]),             # ep 2 x edp 2: dp 4
    (4, ["--ep", "2", "--tp", "2"]),
    (4, ["--ep", "2", "--pp", "2", "--zero", "2"]),
], ids=["ep2", "ep2-zero1", "ep4", "ep2xdp2-zero1", "ep2xtp2", "ep2xpp2-zero2"])
def test_expert_parallel_matches_one_rank(ep_reference, tmp_path, nproc, layout):
    # Property: with the experts split over ep ranks (tokens exchanged by all-to-alls), the
    # experts' gradients reduced over the expert-data-parallel group with 1/ep and the dense
    # ones over dp (Note [Expert gradients]), alone or with tp (replicated MoE layers), pp
    # (the first stage's MoE loss terms backpropagated with its output) and ZeRO shards of both
    # groups, the losses and auxiliary losses follow the one-process run to fp32 rounding
    # (rtol 1e-5: only the order of sums differs; a wrong scale or a lost term moves them by
    # far more), the load metrics are exact, and the expert biases are bitwise the reference's.
    m, save = tmp_path / "m.jsonl", tmp_path / "save"
    summary = train(nproc, *EP, *layout, "--metrics-file", str(m), "--save", str(save))
    got, ref = rows(m), ep_reference["rows"]
    assert len(got) == len(ref) == 3
    for k in ("loss", "moe_aux_loss", "moe_z_loss", "grad_norm"):
        np.testing.assert_allclose([r[k] for r in got], [r[k] for r in ref], rtol=1e-5,
                                   err_msg=k)
    for k in ("moe_max_load", "moe_mean_load", "moe_dropped_tokens"):
        assert [r[k] for r in got] == [r[k] for r in ref], k
    assert summary["ep"] == int(layout[1]) and summary["moe_bias_replicated"] is True
    assert summary["moe_layers"] == 2
    b = biases(save, 3)  # the checkpoint holds every expert, whatever the ep
    assert b.keys() == ep_reference["biases"].keys()
    for n in b:
        np.testing.assert_array_equal(b[n], ep_reference["biases"][n])


@pytest.mark.parametrize("zero", [0, 1])
def test_expert_parallel_checkpoint_resumes_at_another_ep(ep_reference, tmp_path, zero):
    # Property (Note [Layout-free checkpoints]): each ep rank saves its experts as boxes of the
    # stacked [E, ...] tensors (and, with ZeRO, its moment shards likewise), so a run saved at
    # ep 2 resumes at ep 1 on the same two ranks and continues the one-process losses to fp32
    # rounding.
    m, save = tmp_path / "m.jsonl", tmp_path / "save"
    args = [*EP, "--zero", str(zero), "--metrics-file", str(m), "--save", str(save)]
    train(2, *args, "--ep", "2", "--exit-interval", "2")
    r = td.checkpoint.CheckpointReader(str(save / "step_00000002"))
    assert r.meta()["parallel"]["ep"] == 2
    assert td.checkpoint.PieceIndex(r).global_shape("h.0.mlp.experts.c_fc.weight")[0] == 4
    train(2, *args, "--resume")
    got = rows(m)
    assert [x["step"] for x in got] == [1, 2, 3]
    np.testing.assert_allclose([x["loss"] for x in got],
                               [x["loss"] for x in ep_reference["rows"]], rtol=1e-5)
