#pragma once
// A grouped GEMM over variable-size groups of rows: one linear layer per group, the weights
// stacked along a leading dim. The expert computation of a mixture-of-experts layer (its rows
// are the tokens permuted by expert, ops/moe_dispatch.h).
#include <optional>
#include <vector>

#include "tardelli/core/tensor.h"
#include "tardelli/ops/activation_linear.h"

namespace td {

// x [N, k] holds G groups of consecutive rows, group g being the next group_sizes[g] rows
// (sizes >= 0, summing to N); weight [G, out, in] (linear's [out, in] per group), bias [G, out]
// or undefined. Returns [N, out] with rows of group g = linear(a_g, weight[g], bias[g]), where
// a = x (k = in) or, with `act`, a = mlp_activation(x, *act) (k = in, or 2 * in for SwiGLU),
// recomputed in backward rather than kept (Note [Recomputed MLP activation]).
// Values and gradients equal those G linear calls (activation_linear with `act`); an empty
// group gets zero weight and bias gradients. One GEMM per non-empty group, written in place
// (CPU: oneDNN; CUDA: cuBLASLt), so a fused grouped kernel can replace the loop behind this
// signature. Under deferred weight gradients (Note [Deferred weight gradients]) the weight's
// gradient is deferred like linear's.
Tensor grouped_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const std::vector<int64_t>& group_sizes,
                      std::optional<MlpActivation> act = std::nullopt);

}  // namespace td
