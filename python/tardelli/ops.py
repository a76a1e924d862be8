"""tardelli.ops: fused kernels and in-place updates under their C++ names, for layers that
build their own autograd (fused GPT blocks, optimizers)."""
from ._C import (adamw_step, adamw_step_capturable, apply_rotary, dropout_apply, embedding_backward,  # noqa: F401
                 flash_attention_backward, flash_attention_forward, gelu_backward, index_add,
                 layer_norm_backward, layer_norm_forward, log_softmax_backward, relu_backward,
                 rms_norm_backward, rms_norm_forward, rope_cache, rotary_kernel, silu_backward,
                 softmax_backward, sum_to)

__all__ = ["adamw_step", "adamw_step_capturable", "apply_rotary", "dropout_apply", "embedding_backward",
           "flash_attention_backward", "flash_attention_forward", "gelu_backward", "index_add",
           "layer_norm_backward", "layer_norm_forward", "log_softmax_backward", "relu_backward",
           "rms_norm_backward", "rms_norm_forward", "rope_cache", "rotary_kernel",
           "silu_backward", "softmax_backward", "sum_to"]
