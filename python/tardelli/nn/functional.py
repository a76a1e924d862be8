"""tardelli.nn.functional: torch.nn.functional's names over the fused C++ ops."""
from .. import _C
from .._api import log_softmax, softmax  # noqa: F401  (the same functions as td.softmax)
from .._tensor import Tensor, TardelliError, TardelliNotImplementedError

_EPS = {"float32": 1.1920928955078125e-07, "bfloat16": 0.0078125, "float16": 0.0009765625}


def gelu(input, approximate="none"):
    return _C.gelu(input, approximate)


def silu(input):
    return _C.silu(input)


def relu(input):
    return _C.relu(input)


def tanh(input):
    return _C.tanh(input)


def sigmoid(input):
    return _C.sigmoid(input)


def linear(input, weight, bias=None):
    """input @ weight.T + bias, one fused GEMM."""
    return _C.linear(input, weight, bias)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _C.layer_norm(input, normalized_shape, weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """eps=None uses the dtype's machine epsilon, as torch does."""
    if eps is None:
        eps = _EPS.get(str(input.dtype).split(".")[-1], 1e-6)
    return _C.rms_norm(input, normalized_shape, weight, eps)


def embedding(input, weight):
    """Rows of `weight` picked by the integer tensor `input`."""
    return _C.embedding(weight, input)


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    """torch's layout: input [N, C] or [N, C, d1, ...] (or [C]), integer target [N, d1, ...]."""
    if weight is not None:
        raise TardelliNotImplementedError("cross_entropy: class weights are not supported")
    if target.is_floating_point():
        raise TardelliNotImplementedError(
            "cross_entropy: class-probability targets are not supported; pass class indices")
    if input.dim() > 2:
        # The C++ op takes classes in the last dim: move torch's class dim 1 there.
        input = input.permute(0, *range(2, input.dim()), 1)
    return _C.cross_entropy(input, target, ignore_index, reduction, label_smoothing)


def dropout(input, p=0.5, training=True, generator=None):
    return _C.dropout(input, p, training, generator)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None):
    """q [B, H, Tq, D], k/v [B, Hkv, Tk, D]; FlashAttention-style fused kernel without a mask."""
    if dropout_p != 0.0:
        raise TardelliNotImplementedError(
            "scaled_dot_product_attention: dropout_p != 0 is not supported (attention dropout "
            "is not implemented); pass dropout_p=0.0")
    return _C.scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale)


def apply_rotary(input, cos, sin):
    """Rotary embedding of input [B, T, H, D] with tables from tardelli.rope_cache."""
    return _C.apply_rotary(input, cos, sin)


__all__ = ["gelu", "silu", "relu", "tanh", "sigmoid", "softmax", "log_softmax", "linear",
           "layer_norm", "rms_norm", "embedding", "cross_entropy", "dropout",
           "scaled_dot_product_attention", "apply_rotary"]
