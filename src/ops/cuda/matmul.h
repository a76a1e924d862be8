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

// Whether fp8_mm_out takes these operands into an `out` of dtype out_dtype: a device with FP8
// tensor cores, a [m, k] and b [n, k] float8 (not both E5M2) with k and n multiples of 16, and
// a float32 / bfloat16 / float16 output. Anything else is the caller's to compute otherwise.
bool fp8_mm_supported(const Tensor& a, const Tensor& b, DType out_dtype);

// out [m, n] = alpha * a @ b^T (+ bias [n], which must have out's dtype, bf16 or f16) through
// cuBLASLt's FP8 kernels (Note [FP8 GEMM on cuBLASLt] in kernels/gemm/gemm.cuh), where
// fp8_mm_supported holds. a and b are copied when they are not row-major with 16-byte aligned
// rows; out is contiguous.
void fp8_mm_out(const Tensor& a, const Tensor& b, float alpha, const Tensor& bias,
                const Tensor& out);

}  // namespace td::cuda_ops
