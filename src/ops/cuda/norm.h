#pragma once
// CUDA side of layer_norm / rms_norm (src/ops/norm.cpp); internal. Same contracts as the public
// layer_norm_forward / layer_norm_backward / rms_norm_forward / rms_norm_backward.
#include <tuple>
#include <utility>

#include "tardelli/ops/norm.h"

namespace td::cuda_ops {

NormForward layer_norm_forward(const Tensor& x, int64_t norm_numel, const Tensor& weight,
                               const Tensor& bias, double eps);
// grad already in x's dtype.
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x,
                                                       const Tensor& mean, const Tensor& rstd,
                                                       const Tensor& weight, bool has_bias,
                                                       int64_t norm_numel);
NormForward rms_norm_forward(const Tensor& x, int64_t norm_numel, const Tensor& weight, double eps);
std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                                            const Tensor& weight, int64_t norm_numel);

}  // namespace td::cuda_ops
