"""tardelli.io: safetensors files, read and written by the C++ library (checkpoint/safetensors.h).

    td.io.save_safetensors({"w": td.randn(3, 4)}, "w.safetensors", metadata={"format": "pt"})
    tensors = td.io.load_safetensors("w.safetensors")    # {"w": Tensor}

Files are byte-compatible with the `safetensors` package (either side reads the other's files).
A truncated or inconsistent file raises TardelliError naming the file and the tensor.
"""
import os

from . import _C

__all__ = ["load_safetensors", "save_safetensors", "safetensors_metadata"]


def load_safetensors(path):
    """Every tensor of the file, as {name: Tensor} in file order (contiguous CPU tensors)."""
    tensors, _ = _C.io.load_safetensors(os.fspath(path))
    return dict(tensors)


def safetensors_metadata(path):
    """The file's "__metadata__" dict ({} when absent)."""
    _, metadata = _C.io.load_safetensors(os.fspath(path))
    return dict(metadata)


def save_safetensors(tensors, path, metadata=None):
    """Writes {name: Tensor} (any layout; requires_grad is dropped) to `path` atomically.

    metadata: an optional {str: str} stored as "__metadata__" (transformers writes
    {"format": "pt"}).
    """
    if not hasattr(tensors, "items"):
        raise TypeError(f"save_safetensors: expected a dict of tensors, got {type(tensors).__name__}")
    items = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"save_safetensors: tensor names must be str, got {type(name).__name__}")
        if not isinstance(t, _C.Tensor):
            raise TypeError(f"save_safetensors: '{name}' is a {type(t).__name__}, expected a "
                            "tardelli Tensor")
        items.append((name, t))
    meta = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("save_safetensors: metadata must map str to str, got "
                            f"{k!r}: {v!r}")
        meta[k] = v
    _C.io.save_safetensors(items, os.fspath(path), meta)
