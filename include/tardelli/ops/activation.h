#pragma once
// Activations, forward and backward side by side. The *_backward functions are the fused
// gradient kernels (also used by the fused GPT).
#include <string>
#include <utility>

#include "tardelli/core/tensor.h"

namespace td {

enum class GeluApprox { None, Tanh };                // erf form / tanh form (GPT-2)
GeluApprox parse_gelu_approx(const std::string& s);  // "none" | "tanh"

Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::None);
Tensor gelu_backward(const Tensor& grad, const Tensor& x, GeluApprox approx);
// {gelu(x), gelu_backward(grad, x)} from one pass over x and grad (the recomputing MLP's
// backward needs both; Note [Recomputed MLP activation]). Not recorded by autograd.
std::pair<Tensor, Tensor> gelu_and_backward(const Tensor& grad, const Tensor& x, GeluApprox approx);
Tensor silu(const Tensor& x);
Tensor silu_backward(const Tensor& grad, const Tensor& x);
Tensor relu(const Tensor& x);
Tensor relu_backward(const Tensor& grad, const Tensor& y);  // y = relu(x)

}  // namespace td
