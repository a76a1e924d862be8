#pragma once
// Activations, forward and backward side by side. The *_backward functions are the fused
// gradient kernels (also used by the fused GPT).
#include <string>

#include "tardelli/core/tensor.h"

namespace td {

enum class GeluApprox { None, Tanh };  // erf form / tanh form (GPT-2)
GeluApprox parse_gelu_approx(const std::string& s);  // "none" | "tanh"

Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::None);
Tensor gelu_backward(const Tensor& grad, const Tensor& x, GeluApprox approx);
Tensor silu(const Tensor& x);
Tensor silu_backward(const Tensor& grad, const Tensor& x);
Tensor relu(const Tensor& x);
Tensor relu_backward(const Tensor& grad, const Tensor& y);  // y = relu(x)

}  // namespace td
