#pragma once
// The product kernel behind matmul/linear, for ops that write into slices of a larger output
// (grouped_linear) (internal header).
#include "tardelli/core/tensor.h"

namespace td::ops {

// out = a @ b (+ bias) for a [..., M, K], b [..., K, N], out [..., M, N] of one ndim (>= 2) and
// one floating dtype on one device: oneDNN on the CPU (reduced floats widened to fp32 where it
// has no kernel), cuBLASLt on CUDA. a and b may have any strides (a transposed view is passed as
// strides, not copied); out must be contiguous. bias (optional) is [N]. Not recorded by autograd.
void matmul_out(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out);

}  // namespace td::ops
