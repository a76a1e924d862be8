"""Hugging Face GPT-2 interop for td.models.GPT (C++: include/tardelli/models/hf_gpt2.h).

    model = td.models.GPT.load_hf("gpt2-dir")      # config.json + model.safetensors
    model.save_hf("out-dir")                         # transformers' GPT2LMHeadModel loads it

The directory is the one transformers' save_pretrained(dir, safe_serialization=True) writes.
Names with or without the "transformer." prefix are read; HF's Conv1D [in, out] weights are
transposed to our Linear [out, in] (and back on save). load_hf -> save_hf is bitwise.
`install(GPT)` attaches the two methods; models.py calls it.
"""
import os

from . import _C

__all__ = ["load_hf", "save_hf", "install"]


def load_hf(cls, path, dtype=None):
    """A GPT (arch gpt2) with the weights of the HF GPT-2 directory `path`.

    dtype: the compute dtype ("fp32" | "bf16" | "fp16" or a td dtype; default fp32). Parameters
    are fp32 master weights whatever the file's dtype. Unsupported checkpoints (another
    model_type or activation, untied head, ...) raise TardelliError saying why.
    """
    cpp_config, state_dict = _C.models.load_hf_gpt2(os.fspath(path))
    from .models import GPTConfig  # deferred: models.py imports this module
    fields = {f: getattr(cpp_config, f) for f in _FIELDS}
    if dtype is not None:
        fields["dtype"] = dtype  # GPTConfig accepts "bf16"-style names
    config = GPTConfig(**fields)
    model = cls(config)
    model.load_state_dict(state_dict, strict=True)
    return model


def save_hf(model, path):
    """Writes `path`/config.json and `path`/model.safetensors (HF names, Conv1D layout, tied
    lm_head omitted) atomically. Only arch gpt2; llama raises TardelliError."""
    state_dict = {k: v for k, v in model.state_dict().items()}
    _C.models.save_hf_gpt2(os.fspath(path), _cpp_config(model.config), state_dict)


_FIELDS = ("arch", "vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "d_model",
           "ffn_hidden", "dropout", "norm_eps", "rope_base", "dtype", "seed")


def _cpp_config(config):
    if isinstance(config, _C.models.GPTConfig):
        return config
    c = _C.models.GPTConfig()
    for f in _FIELDS:
        if hasattr(config, f):
            setattr(c, f, getattr(config, f))
    return c


def install(gpt_cls):
    """Adds GPT.load_hf (a classmethod) and GPT.save_hf to the Python GPT wrapper."""
    gpt_cls.load_hf = classmethod(load_hf)
    gpt_cls.save_hf = save_hf
    return gpt_cls
