#pragma once
// CUDA side of matmul / mm / bmm / linear (src/ops/matmul.cpp); internal.
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// out = a @ b (+ bias) through cuBLASLt, for a [..., M, K], b [..., K, N] and out [..., M, N],
// all of one floating dtype and one ndim (>= 2) on one CUDA device. Batch dims of a and b are
// 1 or out's (broadcast); out has a row-major inner matrix (unit column stride). bias (optional)
// is [N] and is fused into the GEMM's epilogue. Inner matrices reach cuBLASLt as transposes and
// leading dims wherever their strides allow; only other layouts are copied. fp32 uses TF32 when
// td::matmul_allow_tf32() is set.
void matmul_out(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out,
                const char* op);

}  // namespace td::cuda_ops
