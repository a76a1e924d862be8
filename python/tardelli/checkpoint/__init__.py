"""tardelli.checkpoint: crash-safe checkpoint directories (the C++ td::checkpoint library).

    w = td.checkpoint.CheckpointWriter(f"{root}/{td.checkpoint.step_dir_name(step)}")
    w.write_tensors("model.safetensors", dict(model.named_parameters()))
    w.write_bytes("tokenizer.json", text.encode())
    w.commit({"step": step})                       # atomic: the directory appears complete
    td.checkpoint.update_latest(root, td.checkpoint.step_dir_name(step))

    path = td.checkpoint.find_latest(root)         # None when there is nothing to resume
    r = td.checkpoint.CheckpointReader(path)
    r.verify()                                     # sizes and CRC-32 of every file
    params = r.read_tensors("model.safetensors")   # {name: td.Tensor}

The directory format, the commit protocol and the training-state layout (model.safetensors,
optimizer.safetensors, meta.json) are described in docs/checkpoints.md. Errors are
td.TardelliError (a RuntimeError) naming the directory and file.
"""
import json
import os
from collections.abc import Mapping

from .. import _C

_ck = _C.checkpoint

FORMAT_NAME = _ck.FORMAT_NAME
FORMAT_VERSION = _ck.FORMAT_VERSION
MODEL_FILE = _ck.MODEL_FILE
OPTIMIZER_FILE = _ck.OPTIMIZER_FILE

__all__ = ["CheckpointWriter", "CheckpointReader", "PieceIndex", "read_global_state",
           "find_latest", "update_latest", "step_dir_name", "crc32", "load_model_state",
           "config_to_dict", "config_from_dict", "FORMAT_NAME", "FORMAT_VERSION", "MODEL_FILE",
           "OPTIMIZER_FILE"]


def _dumps(meta):
    # allow_nan=False: NaN/Infinity are not JSON (the C++ parser would refuse them later).
    return json.dumps(meta, allow_nan=False)


class CheckpointWriter:
    """Writes one checkpoint directory: files go to `final_dir + ".tmp"`, commit() renames it
    into place. With several writers (one per rank, writer_id = rank), each calls finish() and
    writer 0 calls commit(meta, num_writers) after a barrier."""

    def __init__(self, final_dir, writer_id=0):
        self._w = _ck.CheckpointWriter(os.fspath(final_dir), int(writer_id))

    def write_tensors(self, file_name, tensors, metadata=None):
        """tensors: a {name: Tensor} mapping or [(name, Tensor)]; metadata: {str: str}."""
        items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
        self._w.write_tensors(file_name, items, dict(metadata or {}))

    def write_bytes(self, file_name, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        self._w.write_bytes(file_name, bytes(data))

    def copy_file(self, file_name, src_path):
        self._w.copy_file(file_name, os.fspath(src_path))

    def finish(self):
        self._w.finish()

    def commit(self, meta=None, num_writers=1):
        """Writes meta.json (meta: a JSON-serializable dict) and renames the directory into
        place; returns the final directory."""
        return self._w.commit(_dumps({} if meta is None else meta), int(num_writers))

    # Accessors are methods, as in C++.
    def final_dir(self):
        return self._w.final_dir

    def tmp_dir(self):
        return self._w.tmp_dir

    def writer_id(self):
        return self._w.writer_id

    def entries(self):
        """[{"name", "size", "crc32", "writer"}] of the files written so far."""
        return self._w.entries


class CheckpointReader:
    """Reads a committed checkpoint directory (or its .old, when only that survived a crash)."""

    def __init__(self, dir):  # noqa: A002 (torch-style argument name)
        self._r = _ck.CheckpointReader(os.fspath(dir))
        self._meta = json.loads(self._r.meta_json())

    def path(self):
        """The directory actually read (dir, or dir.old)."""
        return self._r.path

    def meta(self):
        """meta.json as a dict (a fresh copy each time)."""
        return json.loads(json.dumps(self._meta))

    def files(self):
        """[{"name", "size", "crc32", "writer"}] ordered by name."""
        return self._r.files()

    def has_file(self, name):
        return self._r.has_file(name)

    def verify(self):
        """Checks every file's size and CRC-32; raises TardelliError naming the first bad file."""
        self._r.verify()

    def read_tensors(self, name, with_metadata=False):
        """{name: Tensor} in file order (after checking the file's CRC); with_metadata=True
        returns (tensors, safetensors __metadata__ dict)."""
        items, metadata = self._r.read_tensors(name)
        tensors = dict(items)
        return (tensors, metadata) if with_metadata else tensors

    def read_metadata(self, name):
        """The safetensors __metadata__ dict of file `name` (after checking its CRC)."""
        return self._r.read_tensors(name)[1]

    def read_bytes(self, name):
        return self._r.read_bytes(name)


class PieceIndex:
    """The global tensors of a checkpoint, whatever layout saved them: the pieces of its
    shards.rank*.safetensors files, or the whole tensors of model.safetensors and
    optimizer.safetensors (include/tardelli/checkpoint/sharded_state.h)."""

    def __init__(self, reader):
        self._reader = reader if isinstance(reader, CheckpointReader) else CheckpointReader(reader)
        self._x = _ck.PieceIndex(self._reader._r)

    def names(self):
        return self._x.names()

    def has(self, name):
        return self._x.has(name)

    def global_shape(self, name):
        return tuple(self._x.global_shape(name))

    def dtype(self, name):
        """The saved dtype's safetensors name ("F32", "BF16", ...)."""
        return self._x.dtype(name)

    def read(self, name, offsets=None, sizes=None):
        """Global tensor `name`, or its box at `offsets` of `sizes` (a fresh tensor)."""
        if offsets is None:
            return self._x.read_full(name)
        return self._x.read(name, (list(offsets), list(sizes)))


def read_global_state(path):
    """{name: tensor} of every global tensor of the checkpoint at `path` (parameters, buffers
    and "<param>.exp_avg" / "<param>.exp_avg_sq" moments), assembled from its pieces."""
    idx = PieceIndex(path)
    return {n: idx.read(n) for n in idx.names()}


def step_dir_name(step):
    """"step_00000100"."""
    return _ck.step_dir_name(int(step))


def update_latest(root, name):
    """Points root/latest at `name` atomically."""
    _ck.update_latest(os.fspath(root), name)


def find_latest(root):
    """The directory to resume from (root/latest's, else the highest complete step_*), or None."""
    return _ck.find_latest(os.fspath(root))


def crc32(data, crc=0):
    """zlib's CRC-32 (equal to zlib.crc32)."""
    return _ck.crc32(bytes(data), crc)


def load_model_state(reader, model):
    """Copies model.safetensors of `reader` (a CheckpointReader) into `model` (a td.models.GPT)
    bitwise, after checking that the checkpoint's config equals the model's (a TardelliError
    lists every differing field) and every name, shape and dtype; the tied head is wte.weight."""
    _ck.load_model_state(reader._r, getattr(model, "_cpp", model))


def config_to_dict(config):
    """A models.GPTConfig as meta.json's "config" object (arch "gpt2"/"llama", dtype
    "fp32"/"bf16"/"fp16")."""
    return json.loads(_ck.config_to_json(config))


def config_from_dict(d):
    """The inverse of config_to_dict: a td.models.GPTConfig (every field required; the C++
    reader checks names, types and validity)."""
    from ..models import GPTConfig
    c = _ck.config_from_json(_dumps(d))  # raises TardelliError naming a bad field
    return GPTConfig(**config_to_dict(c))


def main(argv=None):
    """`python -m tardelli.checkpoint inspect|convert` (tardelli/train/checkpoint_tool.py)."""
    from ..train.checkpoint_tool import main as tool_main
    return tool_main(argv)

