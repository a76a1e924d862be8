"""td.data: the preprocess CLI end to end, Megatron byte compatibility (checked by an
independent numpy reader of the documented format), the Python loader, and error messages."""
import json
import os
import random
import struct
import subprocess
import sys

import numpy as np
import pytest

import tardelli as td
from tardelli.data.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = os.path.join(ROOT, "python")
EOD = "<|endoftext|>"


def run_preprocess(*args):
    env = dict(os.environ, PYTHONPATH=PY + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "tardelli.data.preprocess", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def make_documents(n, seed=0):
    """Documents of 1-4 non-blank lines (so blank lines can separate them) mixing ASCII,
    punctuation, tabs, runs of spaces and non-ASCII text."""
    rng = random.Random(seed)
    words = ["the", "data", "loader", "Megatron", "token", "naïve", "日本語", "ünïcode", "🎉",
             "x=1;", "  spaced", "\ttabbed", "end.", "(paren)", "42", "'quote'", "—dash"]
    docs = []
    for _ in range(n):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
                 for _ in range(rng.randint(1, 4))]
        docs.append("\n".join(lines))
    return docs


def numpy_read(prefix):
    """An independent reader following the format description (not our C++ code): returns
    (dtype code, lengths, pointers, document_indices, list of token arrays)."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", idx[9:17])
    assert version == 1
    code = idx[17]
    sc, dc = struct.unpack("<QQ", idx[18:34])
    lengths = np.frombuffer(idx, dtype="<i4", count=sc, offset=34)
    pointers = np.frombuffer(idx, dtype="<i8", count=sc, offset=34 + 4 * sc)
    doc_idx = np.frombuffer(idx, dtype="<i8", count=dc, offset=34 + 12 * sc)
    assert len(idx) == 34 + 12 * sc + 8 * dc
    np_dtype = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}[code]
    bin_ = open(prefix + ".bin", "rb").read()
    seqs = [np.frombuffer(bin_, dtype=np_dtype, count=int(n), offset=int(p))
            for n, p in zip(lengths, pointers)]
    return code, lengths, pointers, doc_idx, seqs


def read_megatron(prefix):
    """Megatron's own reader when it is installed (it is not in CI)."""
    try:
        from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexed
    except Exception:
        return None
    m = MIndexed(prefix)
    return [np.asarray(m[i]) for i in range(len(m))]


def check_dataset(prefix, docs, append_eod=True):
    """The dataset at prefix decodes back to docs (+ EOD), and the numpy reader agrees with td."""
    ds = td.data.IndexedDataset(prefix)
    tok = Tokenizer.load(prefix + ".tokenizer")
    assert len(ds) == len(docs) and ds.num_documents == len(docs)
    assert ds.dtype_code == td.data.best_dtype_code(tok.vocab_size) == 8  # uint16 for small vocabs
    code, lengths, pointers, doc_idx, seqs = numpy_read(prefix)
    assert code == ds.dtype_code
    assert list(doc_idx) == list(range(len(docs) + 1))
    assert int(lengths.sum()) == ds.num_tokens
    assert pointers[0] == 0 and np.all(np.diff(pointers) == 2 * lengths[:-1])
    for i, doc in enumerate(docs):
        ids = ds[i].numpy()
        np.testing.assert_array_equal(ids, seqs[i].astype(np.int64))
        assert tok.decode(ids.tolist()) == doc + (EOD if append_eod else "")
        assert (ids[-1] == tok.eod_id) == append_eod
    assert ds[-1].numpy().tolist() == ds[len(docs) - 1].numpy().tolist()
    with pytest.raises(IndexError):
        ds[len(docs)]
    mseqs = read_megatron(prefix)
    if mseqs is not None:
        for a, b in zip(mseqs, seqs):
            np.testing.assert_array_equal(a, b)


def test_preprocess_text_roundtrip(tmp_path):
    docs = make_documents(300)
    (tmp_path / "a.txt").write_text("\n\n".join(docs[:150]) + "\n", encoding="utf-8")
    # The second file separates with several blank lines and whitespace-only lines.
    (tmp_path / "b.txt").write_text("\n\n \n\n".join(docs[150:]), encoding="utf-8")
    prefix = tmp_path / "out" / "corpus"
    prefix.parent.mkdir()
    r = run_preprocess("--input", tmp_path / "a.txt", tmp_path / "b.txt", "--output-prefix",
                       prefix, "--vocab-size", 600, "--workers", 2)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["documents"] == 300
    assert summary["dtype"] == "uint16"
    assert "300 documents" in r.stderr
    check_dataset(str(prefix), docs)
    assert summary["tokens"] == td.data.IndexedDataset(str(prefix)).num_tokens
    assert sorted(os.listdir(str(prefix) + ".tokenizer")) == [
        "merges.txt", "special_tokens.json", "vocab.json"]


def test_preprocess_jsonl_with_saved_tokenizer(tmp_path):
    docs = make_documents(120, seed=1)
    docs[3] = "first paragraph\n\nsecond paragraph after a blank line"  # fine in JSONL
    with open(tmp_path / "c.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": 0, "body": d}) + "\n")
        f.write("\n")  # blank lines are ignored
    tok = Tokenizer.train(make_documents(200, seed=2), 500)
    tok.save(str(tmp_path / "tok"))
    prefix = tmp_path / "j"
    r = run_preprocess("--input", tmp_path / "c.jsonl", "--output-prefix", prefix,
                       "--tokenizer-dir", tmp_path / "tok", "--json-key", "body")
    assert r.returncode == 0, r.stderr
    check_dataset(str(prefix), docs)
    ds = td.data.IndexedDataset(str(prefix))
    assert ds[0].numpy().tolist() == tok.encode(docs[0]) + [tok.eod_id]


def test_preprocess_fortune_separator_no_eod(tmp_path):
    docs = ["A fortune.\n\t-- someone", "Another one\nover two lines", "%-free text % here"]
    (tmp_path / "fortunes").write_text("%\n".join(d + "\n" for d in docs) + "%\n")
    prefix = tmp_path / "f"
    r = run_preprocess("--input", tmp_path / "fortunes", "--output-prefix", prefix,
                       "--vocab-size", 300, "--doc-separator", "%", "--no-append-eod")
    assert r.returncode == 0, r.stderr
    check_dataset(str(prefix), docs, append_eod=False)


@pytest.mark.parametrize("case", ["missing", "bad_json", "missing_key", "no_tokenizer", "no_dir"])
def test_preprocess_errors(tmp_path, case):
    good = tmp_path / "g.jsonl"
    good.write_text('{"text": "a"}\n{"text": "b"}\n{"text": oops}\n')
    args = ["--input", good, "--output-prefix", tmp_path / "o", "--vocab-size", 300]
    want = {"bad_json": "g.jsonl:3: invalid JSON", "missing_key": "g.jsonl:1: no key 'content'",
            "missing": "input file not found: " + str(tmp_path / "nope.txt"),
            "no_tokenizer": "exactly one of", "no_dir": "output directory does not exist"}[case]
    if case == "missing":
        args[1] = tmp_path / "nope.txt"
    elif case == "missing_key":
        args += ["--json-key", "content"]
    elif case == "no_tokenizer":
        args = args[:4]
    elif case == "no_dir":
        good.write_text('{"text": "a"}\n')
        args[3] = tmp_path / "nodir" / "o"
    r = run_preprocess(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert want in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o.idx").exists() and not (tmp_path / "o.bin").exists()


def test_builder_and_loader(tmp_path):
    prefix = str(tmp_path / "ds")
    b = td.data.IndexedDatasetBuilder(prefix, td.data.DTYPE_CODES["uint16"])
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 65535, size=int(rng.integers(1, 40))) for _ in range(60)]
    for i, d in enumerate(docs):
        b.add_document(d if i % 2 else d.tolist())  # ndarray or list
    with pytest.raises(td.TardelliError, match="token 65536"):
        b.add_document([1, 65536])
    b.finalize()
    ds = td.data.IndexedDataset(prefix)
    assert [ds[i].numpy().tolist() for i in range(len(ds))] == [d.tolist() for d in docs]
    assert ds.get(3, 1, 2).numpy().tolist() == docs[3][1:3].tolist()
    assert "documents=60" in repr(ds)

    assert td.data.split_documents(1000, [98, 1, 1]) == [(0, 980), (980, 990), (990, 1000)]
    train, valid, test = td.data.build_gpt_datasets(prefix, seq_len=8, seed=5, split=(8, 2, 0))
    assert test is None and (train.doc_begin, train.doc_end) == (0, 48)
    assert (valid.doc_begin, valid.doc_end) == (48, 60)
    assert len(train) == train.samples_per_epoch == (train.tokens_per_epoch - 1) // 8

    loader = td.data.DataLoader(train, micro_batch=4, dp_rank=1, dp_size=2, prefetch=3)
    batches = []
    for step in range(5):
        x, y = loader.next()
        assert tuple(x.shape) == (4, 8) and tuple(y.shape) == (4, 8)
        assert x.dtype == td.int64
        for r in range(4):
            s = train.sample(step * 8 + 4 + r).numpy()
            assert x.numpy()[r].tolist() == s[:-1].tolist()
            assert y.numpy()[r].tolist() == s[1:].tolist()
        batches.append((x.numpy(), y.numpy()))
        assert loader.consumed_samples == (step + 1) * 8
    resumed = td.data.DataLoader(train, 4, 1, 2, consumed_samples=16, prefetch=1)
    for step in range(2, 5):
        x, y = next(resumed)
        np.testing.assert_array_equal(x.numpy(), batches[step][0])
        np.testing.assert_array_equal(y.numpy(), batches[step][1])


def test_dataset_errors(tmp_path):
    with pytest.raises(td.TardelliError, match="cannot open .*missing.idx"):
        td.data.IndexedDataset(str(tmp_path / "missing"))
    prefix = str(tmp_path / "t")
    b = td.data.IndexedDatasetBuilder(prefix, 8)
    b.add_document([1, 2, 3])
    b.finalize()
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(4)
    with pytest.raises(td.TardelliError, match=r"t\.idx: sequence 0 ends at byte 6 but t\.bin has 4 bytes"):
        td.data.IndexedDataset(prefix)
    with pytest.raises(td.TardelliError, match="hold 3 tokens"):
        b2 = td.data.IndexedDatasetBuilder(prefix + "2", 8)
        b2.add_document([1, 2, 3])
        b2.finalize()
        td.data.GPTDataset(td.data.IndexedDataset(prefix + "2"), 0, 1, 4, 0)
