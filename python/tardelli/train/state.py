"""Reading a training checkpoint's model from Python (generate, export, analysis). The
checkpoints themselves are written and resumed by the training loop (include/tardelli/train/
train_state.h, docs/checkpoints.md): format 2's pieces of the global tensors from any layout
(Note [Layout-free checkpoints]), or a whole-tensor checkpoint (examples/train_gpt.cpp's)."""
import tardelli as td

from .. import _C
from . import config as C

_ck = _C.checkpoint


def _index(reader, path):
    """The PieceIndex of a checkpoint (format 2, or whole-tensor files); a format-1 checkpoint
    with tensor-parallel, pipeline or ZeRO shard files is refused by name."""
    meta = reader.meta()
    if meta.get("state_format", 1) < 2:
        legacy = [f["name"] for f in reader.files()
                  if f["name"].startswith(("model.tp", "model.pp", "optimizer.rank"))]
        if legacy:
            raise C.ConfigError(
                f"{path}: a format-1 checkpoint with per-layout shard files ({legacy[0]}, ...); "
                "this version reads format 2 (layout-free) and whole-tensor checkpoints: load "
                "it with the version that wrote it at its layout and save again")
    return _ck.PieceIndex(reader._r)


def _model_names(index):
    return [n for n in index.names() if not n.endswith((".exp_avg", ".exp_avg_sq"))]


def assemble_full_state(reader):
    """The full (one-device) model state of a checkpoint: name -> tensor, whatever layout saved
    it (generate, export)."""
    index = _index(reader, reader.path())
    return {n: index.read_full(n) for n in _model_names(index)}


def load_model(path):
    """A td.models.GPT with the checkpoint's weights, in eval mode (generation, export)."""
    reader = td.checkpoint.CheckpointReader(path)
    model = td.models.GPT(td.checkpoint.config_from_dict(reader.meta()["config"]))
    model.load_state_dict(assemble_full_state(reader), strict=False)
    model.eval()
    return model, reader
