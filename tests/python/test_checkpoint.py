"""td.checkpoint, the binding of the C++ checkpoint directories (the C++ suites test the library
itself in depth; these check what crosses the binding):

  * round trip: tensors of several dtypes (bitwise), bytes, a copied file, meta as a dict;
  * td.checkpoint.crc32 equals zlib.crc32;
  * flipping one byte of a file makes verify() and read_tensors() raise TardelliError naming the
    file;
  * find_latest / update_latest / step_dir_name, and a child process that crashes (the test-only
    TD_CHECKPOINT_CRASH_AT hook) while saving a newer checkpoint leaves the previous one found
    and intact;
  * the GPTConfig <-> meta.json "config" conversion.
"""
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

import tardelli as td

ck = td.checkpoint


def _bits(t):
    # Bitwise view; bf16 has no numpy dtype, so it is widened to fp32 first (exact).
    if t.dtype == td.bfloat16:
        t = t.float()
    return np.asarray(t.detach().numpy()).tobytes()


def test_round_trip(tmp_path):
    gen = td.Generator(3)
    tensors = {"a": td.randn(5, 7, generator=gen), "b": td.arange(10),
               "c": td.randn(3, generator=gen).to(td.bfloat16)}
    src = tmp_path / "tokenizer.json"
    src.write_bytes(b'{"vocab": 3}\x00\xff')
    w = ck.CheckpointWriter(tmp_path / "ck")
    assert w.tmp_dir() == str(tmp_path / "ck") + ".tmp"
    w.write_tensors("model.safetensors", tensors, {"k": "v"})
    w.write_bytes("notes.txt", "héllo")
    w.copy_file("tokenizer.json", src)
    assert [e["name"] for e in w.entries()] == ["model.safetensors", "notes.txt", "tokenizer.json"]
    meta = {"step": 7, "data": {"consumed_samples": 56, "prefix": "x"}, "lr": 1e-05}
    assert w.commit(meta) == str(tmp_path / "ck")
    assert not (tmp_path / "ck.tmp").exists()

    r = ck.CheckpointReader(tmp_path / "ck")
    r.verify()
    m = r.meta()
    assert m["format"] == ck.FORMAT_NAME and m["version"] == ck.FORMAT_VERSION == 1
    assert m["manifests"] == ["MANIFEST.0.json"]
    assert {k: m[k] for k in meta} == meta
    files = {f["name"]: f for f in r.files()}
    assert files["notes.txt"]["size"] == len("héllo".encode())
    assert files["notes.txt"]["crc32"] == zlib.crc32("héllo".encode())
    back, metadata = r.read_tensors("model.safetensors", with_metadata=True)
    assert metadata == {"k": "v"} == r.read_metadata("model.safetensors")
    assert list(back) == ["b", "a", "c"]  # file order: I64, F32, BF16 (the reference's order)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and list(back[name].shape) == list(t.shape)
        assert _bits(back[name]) == _bits(t), name
    assert r.read_bytes("notes.txt") == "héllo".encode()
    assert r.read_bytes("tokenizer.json") == src.read_bytes()
    assert r.has_file("notes.txt") and not r.has_file("nope")


def test_crc32_matches_zlib():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 63, 1000):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert ck.crc32(data) == zlib.crc32(data)
        assert ck.crc32(data[n // 2:], ck.crc32(data[:n // 2])) == zlib.crc32(data)
    assert ck.crc32(b"123456789") == 0xCBF43926


def test_corruption_is_detected(tmp_path):
    w = ck.CheckpointWriter(tmp_path / "ck")
    w.write_tensors("model.safetensors", {"w": td.ones(4, 4)})
    w.write_bytes("ok.txt", b"fine")
    w.commit()
    p = tmp_path / "ck" / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[-5] ^= 0x40  # inside the tensor data: the file still parses
    p.write_bytes(bytes(data))
    r = ck.CheckpointReader(tmp_path / "ck")
    with pytest.raises(td.TardelliError, match=r"'model.safetensors' is damaged: CRC-32 0x"):
        r.verify()
    with pytest.raises(td.TardelliError, match="model.safetensors"):
        r.read_tensors("model.safetensors")
    assert r.read_bytes("ok.txt") == b"fine"


def test_bad_input(tmp_path):
    w = ck.CheckpointWriter(tmp_path / "ck")
    with pytest.raises(td.TardelliError, match="bad file name"):
        w.write_bytes("a/b", b"x")
    with pytest.raises(ValueError):
        w.commit({"loss": float("nan")})  # not JSON
    with pytest.raises(td.TardelliError, match="'format' is reserved"):
        w.commit({"format": "mine"})
    with pytest.raises(td.TardelliError, match="not a complete checkpoint"):
        ck.CheckpointReader(tmp_path / "missing")


def test_latest(tmp_path):
    assert ck.step_dir_name(100) == "step_00000100"
    assert ck.find_latest(tmp_path) is None
    for step in (10, 20):
        w = ck.CheckpointWriter(tmp_path / ck.step_dir_name(step))
        w.write_bytes("x", str(step))
        w.commit({"step": step})
    assert ck.find_latest(tmp_path) == str(tmp_path / "step_00000020")
    ck.update_latest(tmp_path, "step_00000010")
    assert (tmp_path / "latest").read_text() == "step_00000010\n"
    assert ck.find_latest(tmp_path) == str(tmp_path / "step_00000010")


_CHILD = """
import sys
import tardelli as td
w = td.checkpoint.CheckpointWriter(sys.argv[1] + "/step_00000002")
w.write_tensors("model.safetensors", {"w": td.full((3,), 2.0)})
w.commit({"step": 2})
td.checkpoint.update_latest(sys.argv[1], "step_00000002")
"""


@pytest.mark.parametrize("point", ["after_tensors", "before_rename"])
def test_crash_keeps_previous(tmp_path, point):
    w = ck.CheckpointWriter(tmp_path / "step_00000001")
    w.write_tensors("model.safetensors", {"w": td.full((3,), 1.0)})
    w.commit({"step": 1})
    ck.update_latest(tmp_path, "step_00000001")
    env = dict(os.environ, TD_CHECKPOINT_CRASH_AT=point,
               PYTHONPATH=os.path.dirname(os.path.dirname(td.__file__)))
    res = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env)
    assert res.returncode == 42
    assert (tmp_path / "step_00000002.tmp").exists()
    path = ck.find_latest(tmp_path)
    assert path == str(tmp_path / "step_00000001")
    r = ck.CheckpointReader(path)
    r.verify()
    assert r.meta()["step"] == 1
    assert r.read_tensors("model.safetensors")["w"].tolist() == [1.0, 1.0, 1.0]
    # Without the hook the same child commits and moves `latest`.
    env.pop("TD_CHECKPOINT_CRASH_AT")
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, check=True)
    assert ck.find_latest(tmp_path) == str(tmp_path / "step_00000002")
    assert not (tmp_path / "step_00000002.tmp").exists()


def test_config_dict_round_trip():
    cfg = td.models.GPTConfig(arch="llama", vocab_size=1000, n_layer=3, n_head=8, n_kv_head=2,
                              d_model=128, dtype="bf16", rope_base=5e5, seed=7)
    d = ck.config_to_dict(cfg)
    assert d == cfg.to_dict()
    back = ck.config_from_dict(d)
    assert isinstance(back, td.models.GPTConfig) and back == cfg
    bad = dict(d)
    del bad["n_head"]
    with pytest.raises(td.TardelliError, match='missing "n_head"'):
        ck.config_from_dict(bad)


def test_load_model_state(tmp_path):
    # The parameters go in bitwise (the tied head included); another model is refused by name.
    cfg = td.models.GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, d_model=16, seed=1)
    src = td.models.GPT(cfg)
    w = ck.CheckpointWriter(tmp_path / "ck")
    w.write_tensors(ck.MODEL_FILE, dict(src._cpp.named_parameters()))
    w.commit({"config": ck.config_to_dict(cfg)})
    r = ck.CheckpointReader(tmp_path / "ck")
    dst = td.models.GPT(cfg)
    with td.no_grad():
        for _, p in dst._cpp.named_parameters():
            p.zero_()
    ck.load_model_state(r, dst)
    for (n, a), (_, b) in zip(src._cpp.named_parameters(), dst._cpp.named_parameters()):
        assert _bits(a) == _bits(b), n
    with pytest.raises(td.TardelliError, match="n_layer: 1 vs 2"):
        ck.load_model_state(r, td.models.GPT(cfg.replace(n_layer=2)))
