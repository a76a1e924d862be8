"""python -m tardelli.train, tardelli.generate and tardelli.export_hf end to end on tiny models
(2 layers, d_model 64): configuration handling, loss falling, gradient accumulation, exact
resume, checkpoint refusal, metrics, generation and Hugging Face export."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tardelli as td
from tardelli.train import ConfigError, parse_config, train
from tardelli.train.report import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
TINY = ["--layers", "2", "--d-model", "64", "--heads", "2", "--seq-len", "32",
        "--micro-batch-size", "4", "--warmup-steps", "2", "--eval-interval", "0",
        "--no-progress", "--log-interval", "100"]


def run_cli(module, *args, check=True):
    p = subprocess.run([sys.executable, "-m", module, *args], env=ENV, capture_output=True,
                       text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{module} {args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small structured corpus (sentences from a tiny grammar) preprocessed with a trained
    byte-level BPE of 300 tokens: enough regularity that a 2-layer model learns quickly."""
    d = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    subj = ["the cat", "a dog", "my friend", "the old man", "every child", "our teacher"]
    verb = ["sees", "likes", "finds", "follows", "paints", "remembers"]
    obj = ["the red ball", "a small house", "the river", "an open door", "the blue sky"]
    docs = []
    for _ in range(400):
        n = rng.integers(2, 6)
        docs.append(" ".join(f"{subj[rng.integers(6)]} {verb[rng.integers(6)]} "
                             f"{obj[rng.integers(5)]}." for _ in range(n)))
    txt = d / "corpus.txt"
    txt.write_text("\n\n".join(docs) + "\n")
    prefix = d / "corpus"
    run_cli("tardelli.data.preprocess", "--input", str(txt), "--output-prefix", str(prefix),
            "--vocab-size", "300")
    return str(prefix)


# ---- configuration ----


@pytest.mark.parametrize("args, message", [
    (["--synthetic-data", "--vocab-size", "64", "--d-model", "60", "--heads", "8"],
     "--heads 8 does not divide --d-model 60"),
    (["--synthetic-data", "--vocab-size", "64", "--kv-heads", "3", "--arch", "llama"],
     "--kv-heads 3 does not divide --heads 4"),
    ([], "give exactly one data source"),
    (["--data", "/nonexistent/prefix"], "/nonexistent/prefix.idx not found"),
    (["--synthetic-data"], "--synthetic-data needs --vocab-size"),
    (["--synthetic-data", "--vocab-size", "64", "--global-batch-size", "6"],
     "--global-batch-size 6 is not a multiple of --micro-batch-size 8"),
    (["--synthetic-data", "--vocab-size", "64", "--split", "1,2"], "--split must be three"),
    (["--synthetic-data", "--vocab-size", "64", "--resume"], "--resume needs --save"),
    (["--synthetic-data", "--vocab-size", "64", "--device", "tpu"],
     "--device: expected cpu, cuda or cuda:N"),
] + ([] if td.cuda.is_available() else [
    (["--synthetic-data", "--vocab-size", "64", "--device", "cuda"],
     "--device cuda: no CUDA device is available"),
]))
def test_bad_config_values_are_rejected_with_the_key(args, message):
    # Property: each inconsistent configuration is refused before any work, naming the flag.
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_config(args)


def test_default_warmup_accepts_a_short_run_and_an_explicit_bad_one_is_refused():
    # Property: a newcomer's short run with default flags is never refused (the default warmup is
    # Megatron's 0, so the schedule starts at --lr), while an explicit warmup longer than the run
    # is still a configuration error naming both flags.
    base = ["--synthetic-data", "--vocab-size", "64", "--steps", "8"]
    cfg, _ = parse_config(base)
    assert cfg.warmup_steps == 0
    assert td.optim.lr_scheduler.warmup_cosine_lr(0, cfg.warmup_steps, cfg.steps, cfg.lr,
                                                  cfg.lr / 10) == pytest.approx(cfg.lr, 1e-12)
    with pytest.raises(ConfigError, match="--warmup-steps 100 exceeds --steps 8"):
        parse_config(base + ["--warmup-steps", "100"])


def test_unknown_arch_is_an_argparse_error_and_cli_exit_status_is_2(tmp_path):
    # Property: an unknown choice is rejected by the parser (status 2, the valid choices named);
    # a ConfigError from the CLI also ends with status 2 and one line, no traceback.
    p = run_cli("tardelli.train", "--synthetic-data", "--vocab-size", "64", "--arch", "bert",
                check=False)
    assert p.returncode == 2 and "invalid choice: 'bert'" in p.stderr
    p = run_cli("tardelli.train", "--data", str(tmp_path / "missing"), check=False)
    assert p.returncode == 2 and "missing.idx not found" in p.stderr
    assert "Traceback" not in p.stderr


def test_toml_config_then_flags_override(tmp_path):
    # Property: defaults < TOML (tables flattened, '-' or '_' keys) < flags; unknown keys and
    # wrong types are errors naming the key.
    f = tmp_path / "c.toml"
    f.write_text('[model]\nlayers = 3\nd-model = 96\nheads = 3\n[train]\nlr = 1\n'
                 'synthetic_data = true\nvocab_size = 50\n')
    cfg, _ = parse_config(["--config", str(f), "--layers", "5"])
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.lr, cfg.vocab_size) == (5, 96, 3, 1.0, 50)
    assert isinstance(cfg.lr, float)
    f.write_text("layer = 3\n")
    with pytest.raises(ConfigError, match="unknown key 'layer'"):
        parse_config(["--config", str(f)])
    f.write_text('layers = "three"\n')
    with pytest.raises(ConfigError, match="'layers' must be int"):
        parse_config(["--config", str(f)])


# ---- training ----


def test_loss_falls_and_metrics_are_complete(corpus, tmp_path):
    # Property: on a regular corpus 60 steps take the loss well below its start (a working
    # training loop; the initial loss is about ln(300) = 5.7), every step writes a metrics
    # record with the documented keys, eval steps add val_loss, and a loss-curve PNG is written.
    metrics = tmp_path / "m.jsonl"
    save = tmp_path / "ckpt"
    s = train(parse_config(TINY + ["--data", corpus, "--steps", "60", "--lr", "3e-3",
                                   "--eval-interval", "30", "--eval-steps", "2",
                                   "--metrics-file", str(metrics), "--save", str(save),
                                   "--split", "90,10,0"])[0], out=lambda *_: None)
    recs = read_metrics(metrics)
    assert [r["step"] for r in recs] == list(range(1, 61))
    for r in recs:
        assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_bytes"} <= set(r)
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["mem_bytes"] > 0
    assert [r["step"] for r in recs if "val_loss" in r] == [30, 60]
    first = np.mean([r["loss"] for r in recs[:3]])
    last = np.mean([r["loss"] for r in recs[-5:]])
    assert first > 5.0 and last < 0.6 * first, (first, last)
    assert recs[-1]["val_loss"] < 0.6 * first
    assert (save / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert s["step"] == 60 and math.isclose(s["loss"], recs[-1]["loss"])


def test_loss_plot_runs_in_a_child_and_reports_its_failure(tmp_path):
    # Property: the loss curve is drawn by a separate Python process, so its failure (here a
    # missing metrics file) is reported as a reason string instead of raising or crashing.
    from tardelli.train.report import plot_loss_isolated
    ok, why = plot_loss_isolated(str(tmp_path / "missing.jsonl"), str(tmp_path / "l.png"))
    assert not ok and "exit 1" in why and "FileNotFoundError" in why
    assert not (tmp_path / "l.png").exists()


def test_gradient_accumulation_matches_one_big_micro_batch(corpus, tmp_path):
    # Property: global batch 8 as 4 micro-batches of 2 gives the same losses as 1 micro-batch
    # of 8 (same samples, same order); only the summation order differs, so the 5 losses agree
    # to fp32 rounding of the accumulated gradient (relative 1e-5).
    recs = []
    for mb in (8, 2):
        m = tmp_path / f"accum_{mb}.jsonl"
        train(parse_config(TINY + ["--data", corpus, "--steps", "5", "--micro-batch-size",
                                   str(mb), "--global-batch-size", "8", "--metrics-file",
                                   str(m)])[0], out=lambda *_: None)
        recs.append([r["loss"] for r in read_metrics(m)])
    np.testing.assert_allclose(recs[1], recs[0], rtol=1e-5)


def test_resume_is_bitwise_exact_with_dropout(corpus, tmp_path):
    # Property (Note [Exact resume]): stopping after step 4 (--exit-interval) and resuming gives
    # steps 5..8 the SAME losses, bit for bit, as an uninterrupted run; dropout is on, so the
    # dropout generator's state must be restored too; the data loader resumes mid-epoch.
    args = TINY + ["--data", corpus, "--steps", "8", "--dropout", "0.1", "--lr", "2e-3"]
    full = tmp_path / "full.jsonl"
    train(parse_config(args + ["--metrics-file", str(full)])[0], out=lambda *_: None)
    part = tmp_path / "part.jsonl"
    save = tmp_path / "save"
    train(parse_config(args + ["--metrics-file", str(part), "--save", str(save),
                               "--exit-interval", "4"])[0], out=lambda *_: None)
    assert [r["step"] for r in read_metrics(part)] == [1, 2, 3, 4]
    train(parse_config(args + ["--metrics-file", str(part), "--save", str(save),
                               "--resume"])[0], out=lambda *_: None)
    a = [r["loss"] for r in read_metrics(full)]
    b = [r["loss"] for r in read_metrics(part)]
    assert [r["step"] for r in read_metrics(part)] == list(range(1, 9))
    assert a == b  # exact float equality, not approx
    assert td.checkpoint.find_latest(str(save)).endswith("step_00000008")


def _checkpoint_tensors(save, step):
    st = td.checkpoint.read_global_state(os.path.join(save, td.checkpoint.step_dir_name(step)))
    return {k: v.numpy() for k, v in st.items()}


def test_fp16_overflow_skips_the_step_and_resume_keeps_the_scaler(tmp_path):
    # Property (Note [fp16 loss scaling]): under --dtype fp16 a step whose gradients hold inf
    # (injected at step 3) is skipped, not applied: the parameters and AdamW moments after it are
    # bitwise those after step 2, its metrics row says skipped, and the scale backs off 2048 ->
    # 1024 for step 4; clean steps are applied and grow the scale after --loss-scale-window (2)
    # of them. A run stopped after step 2 and resumed repeats the uninterrupted run's losses,
    # scales and final tensors bitwise: the scaler's state is in the checkpoint.
    args = TINY + ["--synthetic-data", "--vocab-size", "64", "--dtype", "fp16", "--steps", "5",
                   "--lr", "2e-3", "--inject-nonfinite-grad", "3", "--initial-loss-scale",
                   "1024", "--loss-scale-window", "2"]
    full, save = tmp_path / "full.jsonl", str(tmp_path / "full")
    s = train(parse_config(args + ["--metrics-file", str(full), "--save", save,
                                   "--save-interval", "1"])[0], out=lambda *_: None)
    rows = read_metrics(full)
    assert [r["skipped"] for r in rows] == [False, False, True, False, False]
    assert [r["loss_scale"] for r in rows] == [1024, 1024, 2048, 1024, 1024]
    assert s["skipped_steps"] == 1 and s["loss_scale"] == 2048
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert not math.isfinite(rows[2]["grad_norm"]) and math.isfinite(rows[3]["grad_norm"])
    after = {k: _checkpoint_tensors(save, k) for k in (2, 3, 4)}
    assert after[2].keys() == after[3].keys()
    for k in after[2]:
        np.testing.assert_array_equal(after[3][k], after[2][k], err_msg=k)  # not applied
    assert any(not np.array_equal(after[4][k], after[3][k]) for k in after[3])  # applied
    part, psave = tmp_path / "part.jsonl", str(tmp_path / "part")
    train(parse_config(args + ["--metrics-file", str(part), "--save", psave,
                               "--exit-interval", "2"])[0], out=lambda *_: None)
    train(parse_config(args + ["--metrics-file", str(part), "--save", psave, "--resume"])[0],
          out=lambda *_: None)
    key = [(r["step"], r["loss"], r["loss_scale"], r["skipped"]) for r in read_metrics(full)]
    assert [(r["step"], r["loss"], r["loss_scale"], r["skipped"])
            for r in read_metrics(part)] == key
    final, resumed = _checkpoint_tensors(save, 5), _checkpoint_tensors(psave, 5)
    for k in final:
        np.testing.assert_array_equal(resumed[k], final[k], err_msg=k)


def test_resume_refuses_a_different_model(corpus, tmp_path):
    # Property: a checkpoint of another model is refused with a message naming each differing
    # field and both values, instead of loading mismatched tensors.
    save = tmp_path / "save"
    train(parse_config(TINY + ["--data", corpus, "--steps", "2", "--save", str(save)])[0],
          out=lambda *_: None)
    p = run_cli("tardelli.train", *TINY, "--data", corpus, "--steps", "4", "--save", str(save),
                "--resume", "--layers", "3", check=False)
    assert p.returncode == 2
    assert "different model" in p.stderr and "n_layer: 3 vs 2" in p.stderr, p.stderr


def test_generate_and_export_hf_from_a_checkpoint(corpus, tmp_path):
    # Property: generate loads the checkpoint (and its tokenizer) and prints the requested
    # number of samples starting with the prompt; export_hf writes a directory transformers
    # loads whose logits equal ours (fp32, 1e-4 absolute).
    save = tmp_path / "save"
    train(parse_config(TINY + ["--data", corpus, "--steps", "20", "--lr", "3e-3", "--save",
                               str(save)])[0], out=lambda *_: None)
    p = run_cli("tardelli.generate", "--checkpoint", str(save), "--prompt", "the cat",
                "--num-samples", "2", "--max-new-tokens", "12")
    assert p.stdout.count("--- sample") == 2
    assert all(s.strip().startswith("the cat") for s in p.stdout.split("---")[2::2])
    out = tmp_path / "hf"
    run_cli("tardelli.export_hf", "--checkpoint", str(save), "--output", str(out))
    transformers = pytest.importorskip("transformers")
    import torch
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(out)).eval()
    from tardelli.train import state
    model, _ = state.load_model(td.checkpoint.find_latest(str(save)))
    ids = [[1, 5, 9, 42, 7, 3]]
    with td.no_grad():
        ours = model(td.tensor(ids, dtype=td.int64)).numpy()
    with torch.no_grad():
        theirs = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    tok = transformers.GPT2TokenizerFast.from_pretrained(str(out))
    assert tok.decode(tok.encode("the cat sees the river.")) == "the cat sees the river."
