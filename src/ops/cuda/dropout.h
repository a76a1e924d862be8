#pragma once
// CUDA side of dropout_apply (src/ops/dropout.cpp); internal.
#include "tardelli/core/rng.h"
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// y = x * mask(st) * scale with the CPU backend's mask (Note [CUDA dropout mask]); p is the
// keep threshold in fp32, scale = 1/(1-p) (0 when p == 1), both formed by the front-end.
Tensor dropout_apply(const Tensor& x, float p, float scale, const PhiloxState& st);

}  // namespace td::cuda_ops
