#pragma once
// CUDA side of rotary_kernel (src/ops/rotary.cpp); internal.
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// x [B, T, H, D] (any strides) on a CUDA device, cos/sin fp32 [T, D/2] on the same device
// (shapes and dtypes already checked); returns the contiguous rotated tensor.
Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse);

}  // namespace td::cuda_ops
