"""Tardelli: a C++20/CUDA training library with a torch-like Python API.

    import tardelli as td
    x = td.randn(4, 8, requires_grad=True)
    td.nn.functional.gelu(x @ x.T).sum().backward()
"""
from . import _C
from . import _tensor as _tensor_sugar

_tensor_sugar.install()

from ._C import (  # noqa: E402
    Generator, Node, PhiloxState, Tensor, TardelliError, abs, add, all, amax, any, apply_rotary,
    argmax, bmm, clamp, cos, cross_entropy, device, div, dropout, dtype, embedding, eq, exp, ge,
    gelu, gt, index_add, index_select, layer_norm, le, linear, log, logical_not, lt, masked_fill,
    matmul, maximum, mean, minimum, mm, mul, ne, neg, norm, pow, promote_types, relu, rms_norm,
    rope_cache, rsqrt, scalar_tensor, scaled_dot_product_attention, sigmoid, silu, sin, sqrt,
    sub, sum, tanh, tril, triu, var)
from ._tensor import Size, TardelliIndexError, TardelliNotImplementedError  # noqa: E402
from ._api import *  # noqa: E402,F401,F403
from . import (amp, autograd, backends, checkpoint, cuda, data, distributed, io,  # noqa: E402
               models, nn, ops, optim, utils)
from .autograd import (enable_grad, inference_mode, is_grad_enabled, no_grad,  # noqa: E402
                       set_grad_enabled)

default_generator = _C.default_generator()

# dtypes, with torch's aliases. Defined last: `float`, `int`, `bool` shadow the builtins here.
float32 = dtype.float32
bfloat16 = dtype.bfloat16
float16 = dtype.float16
int32 = dtype.int32
int64 = dtype.int64
bool = dtype.bool  # noqa: A001
float8_e4m3fn = dtype.float8_e4m3fn
float8_e5m2 = dtype.float8_e5m2
float = float32  # noqa: A001
half = float16
int = int32  # noqa: A001
long = int64

__version__ = "0.1.0"
