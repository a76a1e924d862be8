#pragma once
// CUDA side of copy_ and fill_ (src/ops/copy.cpp, src/ops/factory.cpp); internal.
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// dst <- src, both on the same CUDA device: any strides, any dtypes (converted as the CPU
// backend converts), src broadcast to dst's shape (already validated by the caller).
void copy_(const Tensor& dst, const Tensor& src);
// dst (float8) <- src converted, saturating or not (td::to_fp8), both on the same CUDA device.
void copy_to_fp8_(const Tensor& dst, const Tensor& src, bool saturate);
// dst (float8) <- fp8(float(src) * scale), saturating, in one pass (td::fp8_quantize on a GPU);
// src float32 / bfloat16 / float16, same shape and device.
void scale_to_fp8_(const Tensor& dst, const Tensor& src, float scale);
// Every element of t (any strides) set to value converted to t's dtype.
void fill_(const Tensor& t, double value);

}  // namespace td::cuda_ops
