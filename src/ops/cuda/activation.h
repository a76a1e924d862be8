#pragma once
// CUDA side of the activations (src/ops/activation.cpp); internal. Plain declarations (no CUDA
// headers): the functions exist in CUDA builds only.
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

enum class Activation : int { GeluErf = 0, GeluTanh = 1, Silu = 2, Relu = 3 };

// f(x), contiguous, in x's dtype.
Tensor activation_forward(Activation act, const Tensor& x);
// grad * f'(x) (Relu: `x` is relu's output), contiguous, in x's dtype; grad has x's dtype.
Tensor activation_backward(Activation act, const Tensor& grad, const Tensor& x);

}  // namespace td::cuda_ops
