"""HF GPT-2 interop and safetensors against the real thing: transformers' GPT2LMHeadModel and
the `safetensors` package (pip packages: transformers<4.46 for torch 1.13, safetensors).

  * A tiny random GPT2LMHeadModel saved by save_pretrained(safe_serialization=True) loads into
    td.models.GPT.load_hf (with and without the "transformer." prefix) and gives the same
    logits in fp32: normwise relative error < 1e-5. Both compute in fp32 (unit roundoff 6e-8)
    with sums of <= 256 terms, so honest rounding is ~1e-6, while a wrong transpose, a missing
    bias or another GELU is O(1e-2) or worse.
  * model.save_hf -> GPT2LMHeadModel.from_pretrained loads with no missing or unexpected keys
    and gives the same logits (same bound).
  * load_hf -> save_hf reproduces transformers' model.safetensors byte for byte (so every tensor
    bitwise), and every tensor bitwise through safetensors' own reader.
  * td.io and the `safetensors` package read each other's files, every dtype, bitwise.
"""
import json
import os

import numpy as np
import pytest
import torch

import tardelli as td

# transformers and safetensors come from PyPI into the repo's .venv (scripts/setup.sh); they are
# required, not optional: a missing package fails here instead of silently skipping.
import safetensors.torch as safetensors_torch  # noqa: E402
import transformers  # noqa: E402

HF_CONFIG = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)
B, T = 2, 24


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def hf_model(seed=0):
    """A tiny random GPT2LMHeadModel in eval mode, with every bias and LayerNorm parameter
    perturbed (the default init leaves them 0 / 1, which would hide a mapping mistake)."""
    torch.manual_seed(seed)
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(**HF_CONFIG)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return m


def tokens(seed=1):
    g = np.random.default_rng(seed)
    return g.integers(0, HF_CONFIG["vocab_size"], size=(B, T), dtype=np.int64)


def td_logits(model, idx):
    model.eval()
    with td.no_grad():
        return model(td.from_numpy(idx)).numpy()


def hf_logits(model, idx):
    with torch.no_grad():
        return model(torch.from_numpy(idx)).logits.numpy()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "gpt2"
    m = hf_model()
    m.save_pretrained(d, safe_serialization=True)
    return d, m


def strip_prefix(src, dst):
    """A copy of the HF directory whose safetensors names lack "transformer." (GPT2Model)."""
    os.makedirs(dst)
    with open(os.path.join(src, "config.json")) as f:
        cfg = f.read()
    with open(os.path.join(dst, "config.json"), "w") as f:
        f.write(cfg)
    ts = safetensors_torch.load_file(os.path.join(src, "model.safetensors"))
    stripped = {k.removeprefix("transformer."): v for k, v in ts.items()}
    assert all(not k.startswith("transformer.") for k in stripped)
    safetensors_torch.save_file(stripped, os.path.join(dst, "model.safetensors"),
                                metadata={"format": "pt"})


@pytest.mark.parametrize("prefix", [True, False], ids=["transformer_prefix", "no_prefix"])
def test_load_hf_matches_transformers_logits(hf_dir, tmp_path, prefix):
    d, m = hf_dir
    if not prefix:
        strip_prefix(d, tmp_path / "stripped")
        d = tmp_path / "stripped"
    model = td.models.GPT.load_hf(d)
    assert model.config.arch == "gpt2"
    assert (model.config.d_model, model.config.n_layer, model.config.n_head,
            model.config.vocab_size, model.config.block_size) == (64, 2, 4, 100, 32)
    idx = tokens()
    ref = hf_logits(m, idx)
    got = td_logits(model, idx)
    assert got.shape == ref.shape == (B, T, 100)
    err = rel(got, ref)
    print(f"load_hf logits vs transformers: normwise relative error {err:.2e}")
    assert err < 1e-5
    # The loss too (HF shifts labels inside; we pass shifted targets).
    with torch.no_grad():
        ref_loss = m(torch.from_numpy(idx), labels=torch.from_numpy(idx)).loss.item()
    targets = np.concatenate([idx[:, 1:], np.full((B, 1), -100, np.int64)], axis=1)
    with td.no_grad():
        loss = model(td.from_numpy(idx), td.from_numpy(targets)).item()
    assert abs(loss - ref_loss) / ref_loss < 1e-5


def test_save_hf_loads_in_transformers(tmp_path):
    cfg = td.models.GPTConfig(arch="gpt2", vocab_size=100, block_size=32, n_layer=2, n_head=4,
                              d_model=64, seed=5)
    model = td.models.GPT(cfg)
    with td.no_grad():  # non-trivial biases and norm weights
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(td.randn(*p.shape) * 0.1)
    out = tmp_path / "exported"
    model.save_hf(out)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == [] and info["error_msgs"] == []
    hf.eval()
    assert hf.config.n_embd == 64 and hf.config.activation_function == "gelu_new"
    idx = tokens(2)
    err = rel(hf_logits(hf, idx), td_logits(model, idx))
    print(f"save_hf -> transformers logits: normwise relative error {err:.2e}")
    assert err < 1e-5


def test_load_save_round_trip_is_bitwise(hf_dir, tmp_path):
    d, _ = hf_dir
    model = td.models.GPT.load_hf(d)
    model.save_hf(tmp_path / "again")
    src = (d / "model.safetensors").read_bytes()
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == src
    a = safetensors_torch.load_file(d / "model.safetensors")
    b = safetensors_torch.load_file(tmp_path / "again" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)), k
    # The config says the same model.
    c1 = json.loads((d / "config.json").read_text())
    c2 = json.loads((tmp_path / "again" / "config.json").read_text())
    for k in ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "layer_norm_epsilon",
              "activation_function", "model_type", "n_inner"):
        assert c1[k] == c2[k], k


def test_safetensors_interop_with_the_package(tmp_path):
    torch.manual_seed(0)
    ref = {
        "f32": torch.randn(3, 5),
        "bf16": torch.randn(4, 2).to(torch.bfloat16),
        "f16": torch.randn(7).to(torch.float16),
        "i32": torch.randint(-100, 100, (2, 3), dtype=torch.int32),
        "i64": torch.randint(-(1 << 40), 1 << 40, (4,), dtype=torch.int64),
        "bool": torch.rand(6) > 0.5,
        "scalar": torch.tensor(1.25),
    }
    py_file = tmp_path / "py.safetensors"
    safetensors_torch.save_file(ref, py_file, metadata={"format": "pt", "k": "v"})
    got = td.io.load_safetensors(py_file)
    assert td.io.safetensors_metadata(py_file) == {"format": "pt", "k": "v"}
    assert set(got) == set(ref)

    def as_np(t):
        return t.float().numpy() if t.dtype in (td.bfloat16,) else t.numpy()

    for k, t in ref.items():
        want = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        assert tuple(got[k].shape) == tuple(t.shape), k
        np.testing.assert_array_equal(as_np(got[k]), want, err_msg=k)
    # Written back by td: the same bytes as the package's file, and the package reads it.
    td_file = tmp_path / "td.safetensors"
    td.io.save_safetensors(got, td_file, metadata={"format": "pt", "k": "v"})
    back = safetensors_torch.load_file(td_file)
    for k, t in ref.items():
        assert torch.equal(back[k], t), k
    # Same header (parsed: the package keeps metadata in a Rust HashMap, so its key order
    # varies) and the same data bytes.
    n = int.from_bytes(py_file.read_bytes()[:8], "little")
    hp = json.loads(py_file.read_bytes()[8:8 + n])
    ht = json.loads(td_file.read_bytes()[8:8 + n])
    assert hp == ht
    assert py_file.read_bytes()[8 + n:] == td_file.read_bytes()[8 + n:]


def test_errors_are_clear(hf_dir, tmp_path):
    d, _ = hf_dir
    # llama cannot be exported as GPT-2.
    llama = td.models.GPT(td.models.GPTConfig(arch="llama", vocab_size=50, block_size=16,
                                              n_layer=1, n_head=2, d_model=16))
    with pytest.raises(td.TardelliError, match="only arch gpt2 can be exported"):
        llama.save_hf(tmp_path / "llama")
    assert not (tmp_path / "llama").exists()
    # A truncated safetensors file names the file.
    bad = tmp_path / "truncated"
    bad.mkdir()
    (bad / "config.json").write_bytes((d / "config.json").read_bytes())
    (bad / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-100])
    with pytest.raises(td.TardelliError, match=r"model\.safetensors.*truncated"):
        td.models.GPT.load_hf(bad)
    # An activation we do not implement.
    cfg = json.loads((d / "config.json").read_text())
    cfg["activation_function"] = "relu"
    (bad / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes())
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(td.TardelliError, match="activation_function \"relu\" is not supported"):
        td.models.GPT.load_hf(bad)
    with pytest.raises(TypeError, match="expected a tardelli Tensor"):
        td.io.save_safetensors({"x": np.zeros(3)}, tmp_path / "x.safetensors")
