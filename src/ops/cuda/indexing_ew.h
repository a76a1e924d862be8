#pragma once
// CUDA side of masked_fill, where, tril and triu (src/ops/indexing.cpp); internal.
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// out = mask ? value : x; mask (bool) broadcast to x's shape, out allocated like x.
void masked_fill_into(const Tensor& out, const Tensor& x, const Tensor& mask, double value);
// out = cond ? a : b; a and b of out's dtype, all broadcast to out's shape.
void where_into(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
// out (contiguous, x's shape) = x with the elements outside the triangle zeroed: kept where
// j - i >= k (upper, triu) or j - i <= k (tril), (i, j) indexing the last two dims.
void triangle_into(const Tensor& out, const Tensor& x, bool upper, int64_t k);

}  // namespace td::cuda_ops
