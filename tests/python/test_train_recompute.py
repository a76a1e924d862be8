"""Activation recomputation through the trainer (--recompute none|selective|full,
--recompute-layers N; docs/memory.md): under every parallel layout the recomputation must not
change a loss. The single-device bitwise checks per mode and the memory formulas are C++
(tests/models/test_recompute.cpp, tests/autograd/test_checkpoint.cpp)."""
import pytest

import tardelli as td
from tardelli.train import ConfigError, parse_config
from tardelli.utils.checkpoint import checkpoint

from cli_runner import metrics, run

# 8 samples per step of 16 tokens; 4 layers so that pp 2 x vpp 2 has one layer per chunk.
BASE = ["--synthetic-data", "--vocab-size", "64", "--layers", "4", "--d-model", "32",
        "--heads", "2", "--seq-len", "16", "--global-batch-size", "8", "--steps", "3",
        "--warmup-steps", "1", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
        "--log-interval", "1", "--ddp-bucket-mb", "0.01"]

# (ranks, flags, full-recompute flags): each layout with its own full-recompute variant.
LAYOUTS = {
    "tp2-sp": (2, ["--tp", "2", "--sequence-parallel", "--micro-batch-size", "2"],
               ["--recompute", "full"]),
    "pp2-1f1b": (2, ["--pp", "2", "--schedule", "1f1b", "--micro-batch-size", "2"],
                 ["--recompute", "full", "--recompute-layers", "1"]),
    "pp2-interleaved": (2, ["--pp", "2", "--vpp", "2", "--schedule", "interleaved",
                            "--micro-batch-size", "2"], ["--recompute", "full"]),
    "pp2-zb": (2, ["--pp", "2", "--schedule", "zb", "--micro-batch-size", "2"],
               ["--recompute", "full"]),
    "dp2": (2, ["--micro-batch-size", "2"], ["--recompute", "full"]),
}

pytestmark = pytest.mark.skipif(not td.distributed.mpi_available(),
                                reason="built without MPI (TD_WITH_MPI=OFF)")


def records(tmp_path, name, nproc, *args):
    m = tmp_path / f"{name}.jsonl"
    run(nproc, "tardelli.train", *BASE, *args, "--metrics-file", m)
    return metrics(m)


def losses(tmp_path, name, nproc, *args):
    return [r["loss"] for r in records(tmp_path, name, nproc, *args)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, the whole global batch as 4 micro-batches of 2 (gradient accumulation),
    no dropout, no recomputation."""
    return losses(tmp_path_factory.mktemp("ref"), "ref", 1, "--micro-batch-size", "2",
                  "--dropout", "0", "--recompute", "none")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_recompute_keeps_losses(reference, tmp_path, layout):
    # Property 1: with dropout 0.1 (the masks must be replayed in the recomputation: the model's
    # stream, the sequence-parallel split stream, the per-stage pipeline streams), full
    # recomputation (for pp 1f1b: the first block of each stage only) repeats the same layout's
    # losses without recomputation (none) bit for bit over 3 AdamW steps with gradient
    # accumulation.
    # Property 2: without dropout, full recomputation on the layout matches one process without
    # recomputation to fp32 rounding (relative 1e-5), as the layout itself does.
    # And the recomputation is really on: rank 0's step peak (allocator) is lower than without
    # it (a block keeps ~2.3 KB per token under none, 128 B under full).
    nproc, flags, full = LAYOUTS[layout]
    base = records(tmp_path, "none", nproc, *flags, "--dropout", "0.1", "--recompute", "none")
    rec = records(tmp_path, "full", nproc, *flags, "--dropout", "0.1", *full)
    assert [r["loss"] for r in rec] == [r["loss"] for r in base]
    assert max(r["mem_bytes"] for r in rec) < max(r["mem_bytes"] for r in base)
    no_drop = losses(tmp_path, "nodrop", nproc, *flags, "--dropout", "0", *full)
    assert no_drop == pytest.approx(reference, rel=1e-5)


def test_recompute_none_keeps_losses_under_tp(tmp_path):
    # Property: recompute none (the MLP activation stored, the unfused path through the
    # tensor-parallel row layer) gives the selective losses of the same layout bit for bit.
    flags = LAYOUTS["tp2-sp"][1] + ["--dropout", "0.1"]
    assert losses(tmp_path, "none", 2, *flags, "--recompute", "none") == \
        losses(tmp_path, "sel", 2, *flags, "--recompute", "selective")


@pytest.mark.parametrize("args, message", [
    (["--recompute-layers", "3", "--recompute", "full", "--pp", "2"],
     "--recompute-layers 3 exceeds the 2 layers of pipeline stage 0"),
    (["--recompute-layers", "2", "--recompute", "full", "--pp", "2",
      "--pipeline-layout", "3,1"],
     "--recompute-layers 2 exceeds the 1 layers of pipeline stage 1"),
    (["--recompute-layers", "1"], "needs --recompute full (got --recompute selective)"),
    (["--recompute-layers", "-1", "--recompute", "full"], "--recompute-layers must be >= 0"),
])
def test_bad_recompute_flags_are_rejected_before_work(args, message):
    # Property: an impossible recomputation is a ConfigError naming the flag, raised while
    # parsing, i.e. before any rank builds a model (world_size 2 for the pp cases).
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(BASE + ["--micro-batch-size", "2"] + args, world_size=2)


def test_unknown_recompute_mode_cli_exit_status_2():
    # Property: an unknown mode is refused by the parser, naming the valid choices; in a TOML
    # file the same value is a ConfigError naming the key.
    p = run(1, "tardelli.train", *BASE, "--recompute", "partial", check=False)
    assert p.returncode == 2 and "invalid choice: 'partial'" in p.stderr
    assert "'none', 'selective', 'full'" in p.stderr


def test_unknown_recompute_mode_in_toml(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('recompute = "partial"\n')
    with pytest.raises(ConfigError, match="--recompute: unknown value 'partial'"):
        parse_config(["--config", str(f)] + BASE)


def test_model_set_recompute_api():
    # Property: the Python model exposes the option and its errors (a stage's layer count
    # bounds num_layers); the value is not part of the config (checkpoints unaffected).
    cfg = td.models.GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, d_model=16)
    m = td.models.GPT(cfg)
    assert m.recompute == ("selective", -1)
    m.set_recompute("full", 1)
    assert m.recompute == ("full", 1)
    with pytest.raises(td.TardelliError, match="this stage holds 2 layers"):
        m.set_recompute("full", 3)
    with pytest.raises(td.TardelliError, match="unknown mode 'partial'"):
        m.set_recompute("partial")
    assert "recompute" not in cfg.to_dict()


def test_python_checkpoint_matches_direct_call():
    # Property: td.utils.checkpoint.checkpoint(fn, x, w) (a Python function with dropout from
    # the default generator and a non-tensor argument) gives the direct call's output and
    # gradients bit for bit, and fires the parameter's post-accumulate hook once.
    g = td.Generator(3)
    x0, w0 = td.randn(4, 6, generator=g), td.randn(6, 6, generator=g)

    def fn(x, w, p):
        return td.nn.functional.dropout(td.tanh(x @ w), p) * 2.0

    def grads(use_checkpoint):
        td.manual_seed(5)
        x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        fired = []
        w.register_post_accumulate_grad_hook(lambda p: fired.append(1))
        y = checkpoint(fn, x, w, 0.3) if use_checkpoint else fn(x, w, 0.3)
        (y * y).sum().backward()
        return y.tolist(), x.grad.tolist(), w.grad.tolist(), len(fired)

    assert grads(True) == grads(False)
