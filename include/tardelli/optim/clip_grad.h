#pragma once
// Gradient clipping by total norm (torch.nn.utils.clip_grad_norm_).
#include <limits>

#include "tardelli/core/tensor.h"

namespace td::optim {

inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

// The norm of all gradients of `params` together (params without a gradient are skipped):
// (sum_i |g_i|^p)^(1/p), or max_i |g_i| for p = inf; accumulated in double in a fixed order
// (independent of thread count). When max_norm / (total + 1e-6) < 1, every gradient is
// multiplied by that factor in place (torch's rule). Returns the total norm before clipping
// (0 when no parameter has a gradient). A non-finite total norm leaves the gradients as they are
// and is returned (error_if_nonfinite=true makes it a td::Error instead).
double clip_grad_norm_(const TensorList& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// The total norm alone, no clipping.
double grad_norm(const TensorList& params, double norm_type = 2.0);

}  // namespace td::optim
