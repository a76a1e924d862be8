"""--fp8 in `python -m tardelli.train` on one rank (docs/fp8.md): the blocks' linears through
the emulated FP8 GEMM (hybrid: E4M3 forward, E5M2 gradients; e4m3: every tensor in E4M3, delayed
scaling) train like bf16, the scaling state resumes bitwise, the per-layer precision flags
(--precision-policy, --precision-map) work and bad values are refused naming the flag or entry.
Multi-rank layouts: test_train_fp8_parallel.py."""
import json

import numpy as np
import pytest

from tardelli.train import config as C

from cli_runner import make_corpus, metrics, run

SMALL = ["--layers", "2", "--d-model", "64", "--heads", "2", "--seq-len", "32",
         "--micro-batch-size", "4", "--global-batch-size", "8", "--warmup-steps", "10",
         "--lr", "3e-3", "--no-progress", "--eval-interval", "0", "--log-interval", "50"]
SYNTH = ["--synthetic-data", "--vocab-size", "128", *SMALL]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=2)


def test_fp8_trains_like_bf16(corpus, tmp_path):
    # Property (issue 27): a small GPT learning a regular corpus for 200 steps with --fp8
    # hybrid and with --fp8 e4m3 (bf16 compute around the FP8 GEMMs) ends within 2% of the bf16
    # run's final loss (mean of the last 10 steps), and the FP8 path is really taken (the
    # losses differ from bf16's and between the two recipes).
    out = {}
    for name, extra in (("bf16", []), ("hybrid", ["--fp8", "hybrid"]),
                        ("e4m3", ["--fp8", "e4m3"])):
        m = tmp_path / f"{name}.jsonl"
        run(1, "tardelli.train", "--data", corpus, "--split", "100,0,0", *SMALL, "--steps",
            "200", "--dtype", "bf16", *extra, "--metrics-file", m, timeout=900)
        out[name] = [r["loss"] for r in metrics(m)]
    final = {k: float(np.mean(v[-10:])) for k, v in out.items()}
    print("final losses (mean of the last 10 steps):", json.dumps(final))
    assert final["bf16"] < 0.5 * out["bf16"][0], final  # it learned
    for recipe in ("hybrid", "e4m3"):
        assert abs(final[recipe] - final["bf16"]) <= 0.02 * final["bf16"], final
        assert out[recipe] != out["bf16"]
    assert out["hybrid"] != out["e4m3"]


@pytest.mark.parametrize("extra", [
    ["--fp8", "hybrid", "--fp8-amax-history", "3"],
    # Adaptive with a low error threshold and a 2-step window: every linear is promoted at
    # step 2 and two are demoted at steps 7 and 8, one of them mid-window at the resume point.
    ["--fp8", "e4m3", "--precision-policy", "adaptive", "--precision-fp8-error", "0.035",
     "--precision-stable-steps", "2"],
], ids=["hybrid", "adaptive"])
def test_fp8_resume_is_bitwise(tmp_path, extra):
    # Property: the delayed-scaling state (each linear's scales and amax histories) and the
    # adaptive policy's state (each linear's precision and stable-step count) are in the
    # checkpoint, so a run stopped after step 6 and resumed repeats the uninterrupted losses
    # and precision decisions bit for bit.
    args = [*SYNTH, "--steps", "8", "--warmup-steps", "1", "--log-interval", "1", *extra]
    full, part, save = tmp_path / "full.jsonl", tmp_path / "part.jsonl", tmp_path / "save"
    run(1, "tardelli.train", *args, "--metrics-file", full)
    run(1, "tardelli.train", *args, "--metrics-file", part, "--save", save, "--exit-interval", "6")
    if "adaptive" in extra:
        saved = json.loads((save / "step_00000006" / "rng.rank00000.json").read_text())
        assert max(saved["chunks"][0]["precision"]["stable"]) > 0  # a window in progress
    run(1, "tardelli.train", *args, "--metrics-file", part, "--save", save, "--resume")
    a, b = metrics(full), metrics(part)
    assert [r["loss"] for r in b] == [r["loss"] for r in a]
    assert [r.get("precision") for r in b] == [r.get("precision") for r in a]
    if "adaptive" in extra:
        moved = [i for i, r in enumerate(a) if r["precision"].get("changes")]
        assert moved and min(moved) < 6 <= max(moved), [r["precision"] for r in a]


def test_precision_map_pins_linears(tmp_path):
    # Property: --precision-map sets the listed linears' precision (the others stay fp8 under
    # --fp8): the metrics count them, and the run differs from plain --fp8 (the map is used).
    pmap = tmp_path / "map.toml"
    pmap.write_text('"h.0.mlp.c_fc" = "bf16"\n"blocks.1.attn_out" = "fp32"\n')
    m, plain = tmp_path / "m.jsonl", tmp_path / "plain.jsonl"
    args = [*SYNTH, "--steps", "2", "--warmup-steps", "1", "--fp8", "hybrid"]
    run(1, "tardelli.train", *args, "--precision-map", pmap, "--metrics-file", m)
    run(1, "tardelli.train", *args, "--metrics-file", plain)
    rows = metrics(m)
    assert rows[0]["precision"] == {"fp8": 6, "bf16": 1, "fp32": 1}
    assert [r["loss"] for r in rows] != [r["loss"] for r in metrics(plain)]


@pytest.mark.parametrize("argv, world, message", [
    (["--fp8", "hybrid", "--fp8-amax-history", "-1"], 1, "--fp8-amax-history must be >= 0"),
    (["--fp8", "hybrid", "--fp8-margin", "-1"], 1, "--fp8-margin must be >= 0"),
    (["--precision-fp8-error", "-1"], 1, "--precision-fp8-error must be >= 0"),
    (["--precision-stable-steps", "0"], 1, "--precision-stable-steps must be >= 1"),
    (["--precision-policy", "adaptive", "--zero", "3"], 2, "with --zero 3"),
])
def test_bad_fp8_flags(argv, world, message):
    with pytest.raises(C.ConfigError, match=message):
        C.parse_config([*SYNTH, *argv], world_size=world)


@pytest.mark.parametrize("content, suffix, message", [
    ('{"h.7.mlp.c_fc": "bf16"}', ".json", "entry 'h.7.mlp.c_fc': the model has layers 0..1"),
    ('{"h.0.mlp.fc1": "bf16"}', ".json", "entry 'h.0.mlp.fc1': not a block linear"),
    ('{"blocks.1.mlp_in": "fp4"}', ".json", "entry 'blocks.1.mlp_in': unknown precision 'fp4'"),
    ('"h.0.attn.c_attn" = 8', ".toml", "entry 'h.0.attn.c_attn': expected a precision string"),
    ('{"h.0.attn.c_attn": "fp8"}', ".json", "entry 'h.0.attn.c_attn' is fp8 but --fp8 is none"),
    ('{"h.0.attn.c_attn": ', ".json", "--precision-map"),
])
def test_bad_precision_map(tmp_path, content, suffix, message):
    # Property: a bad map is refused before any work, naming the file's entry.
    p = tmp_path / f"map{suffix}"
    p.write_text(content)
    with pytest.raises(C.ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        C.parse_config([*SYNTH, "--precision-map", str(p)], world_size=1)


def test_model_set_fp8_api():
    # Property: the Python model's set_fp8 routes the blocks' linears through FP8 (the loss of
    # a training forward changes against the same weights without it), commit_fp8 moves the
    # noted amaxes into the scales (the next forward's loss changes again, the weights being the
    # same), and a bad recipe is refused naming it.
    import tardelli as td
    cfg = td.models.GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=32,
                              seed=3)
    plain, f8 = td.models.GPT(cfg), td.models.GPT(cfg)
    assert not f8.fp8
    assert f8.set_fp8(history=4, margin=0.0, recipe="hybrid") is f8
    assert f8.fp8
    x = td.from_numpy(np.random.default_rng(0).integers(0, 64, (2, 16)))
    plain.train()
    f8.train()
    l_plain, l0 = plain(x, x).item(), f8(x, x).item()
    assert l0 != l_plain
    l1 = f8(x, x).item()
    assert l1 == l0  # nothing committed: the same scales
    f8.commit_fp8()
    assert f8(x, x).item() != l0  # the scales moved from 1.0 to the amaxes'
    with pytest.raises(td.TardelliError, match="'e5m2'"):
        td.models.GPT(cfg).set_fp8(recipe="e5m2")
