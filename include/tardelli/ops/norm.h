#pragma once
// Fused normalizations over the trailing `normalized_shape` dims: one pass for the statistics,
// fp32 statistics for every dtype; backward computes dx, dweight and dbias together.
#include <tuple>

#include "tardelli/core/tensor.h"

namespace td {

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                double eps = 1e-6);

// The fused kernels. `mean`/`rstd` are fp32 per-row statistics from the forward.
struct NormForward {
  Tensor y, mean, rstd;  // mean undefined for rms_norm
};
NormForward layer_norm_forward(const Tensor& x, int64_t norm_numel, const Tensor& weight,
                               const Tensor& bias, double eps);
// Returns {dx, dweight, dbias} (dweight/dbias undefined when weight/bias are).
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x,
                                                       const Tensor& mean, const Tensor& rstd,
                                                       const Tensor& weight, bool has_bias,
                                                       int64_t norm_numel);
NormForward rms_norm_forward(const Tensor& x, int64_t norm_numel, const Tensor& weight, double eps);
std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                                            const Tensor& weight, int64_t norm_numel);

}  // namespace td
