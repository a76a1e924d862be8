#pragma once
// GEMM through cuBLASLt with row-major semantics (what the CPU backend and td::Tensor use):
//
//   C[b] = act(alpha * op(A[b]) @ op(B[b]) + beta * C[b] + bias)      for b < batch
//
// op(A) is [m, k] and op(B) is [k, n]; C is [m, n]. Storage types float, bf16 or fp16 (A, B, C,
// bias and aux all of one type), always accumulated in fp32; fp32 may use TF32 tensor cores when
// allow_tf32 is set.
//
// Note [Row-major GEMM on cuBLASLt]: cuBLASLt is column-major. A row-major [r, c] matrix with
// row stride ld is, byte for byte, a column-major [c, r] matrix with leading dimension ld, i.e.
// its transpose. So C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our
// B, its "B" is our A, its output has n rows and m columns, and every ld carries over unchanged.
// The bias [n] is then a per-row vector of cuBLASLt's D, which is what its BIAS epilogue adds;
// the bias gradient of our A (a [m] vector) is cuBLASLt's BGRADB, that of our B is BGRADA.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace td::kernels {

enum class GemmType { kFloat32, kBFloat16, kFloat16 };

// The operand whose bias gradient the epilogue writes (a sum of op(X) over k).
enum class GemmBiasGrad {
  kNone,
  kA,  // bias_grad[i] = sum_k op(A)[i, k], length m (e.g. dbias from dW = dY^T X, A = dY^T)
  kB,  // bias_grad[j] = sum_k op(B)[k, j], length n
};

struct GemmArgs {
  GemmType dtype = GemmType::kFloat32;
  int64_t m = 0, n = 0, k = 0;
  // A: row-major [m, k] with row stride lda >= k, or with trans_a row-major [k, m] (lda >= m).
  const void* a = nullptr;
  int64_t lda = 0;
  bool trans_a = false;
  // B: row-major [k, n] (ldb >= n), or with trans_b row-major [n, k] (ldb >= k).
  const void* b = nullptr;
  int64_t ldb = 0;
  bool trans_b = false;
  // C: row-major [m, n] with ldc >= n; read only when beta != 0, written in place.
  void* c = nullptr;
  int64_t ldc = 0;
  // Strided batch: matrix i of X starts at x + i * stride_x elements. Strides must be non-zero
  // when batch > 1 (callers loop over broadcast dims themselves).
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.f, beta = 0.f;
  bool allow_tf32 = false;  // fp32 only: TF32 tensor cores (10-bit mantissa products)
  // Epilogues. bias: [n], contiguous, added to every row (shared by the whole batch).
  const void* bias = nullptr;
  // gelu: C = gelu_tanh(pre) with pre = alpha*AB + beta*C + bias; gelu_aux (optional) receives
  // pre, row-major [m, n] with row stride ld_aux (a multiple of 8, >= n) and batch stride
  // stride_aux (a multiple of 8), for the backward pass.
  bool gelu = false;
  void* gelu_aux = nullptr;
  int64_t ld_aux = 0, stride_aux = 0;
  // Bias gradient (batch == 1, no bias or gelu): written to bias_grad, contiguous.
  GemmBiasGrad bias_grad_of = GemmBiasGrad::kNone;
  void* bias_grad = nullptr;
  // Scratch for cuBLASLt (from the caching allocator); gemm_workspace_bytes() is enough.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

// FP8 GEMM (sm_89 and newer): C = alpha * A B^T (+ bias), with A row-major [m, k] and B
// row-major [n, k] holding FP8 codes, products accumulated in fp32 and written as C's type.
//
// Note [FP8 GEMM on cuBLASLt]: cuBLASLt's FP8 kernels take only the "TN" layout (its A
// transposed, its B not) and 16-byte aligned leading dimensions. By Note [Row-major GEMM on
// cuBLASLt] its A is our B: a row-major [n, k] B is a column-major k x n matrix taken
// transposed, and a row-major [m, k] A is a column-major k x m matrix taken as it is. So A B^T
// with both operands k-contiguous is exactly that layout; any other product (the backward
// GEMMs) transposes its FP8 operands first (TransformerEngine keeps such transposed copies too).
// The operands' per-tensor scales enter as alpha (the product of their dequantization
// factors): D = alpha (A B^T) + bias, the value an FP8 tensor pair represents, in fp32 before
// the output is rounded. E5M2 x E5M2 has no kernel. fast_accum lets Hopper's kernels fold the
// tensor cores' partial sums less often (faster, less accurate: TransformerEngine's forward
// setting); it stays off unless asked for.
enum class Fp8Type { kE4M3, kE5M2 };

struct Fp8GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // [m, k] codes, row stride lda (a multiple of 16, >= k)
  int64_t lda = 0;
  Fp8Type a_type = Fp8Type::kE4M3;
  const void* b = nullptr;  // [n, k] codes, row stride ldb (a multiple of 16, >= k)
  int64_t ldb = 0;
  Fp8Type b_type = Fp8Type::kE4M3;
  void* c = nullptr;  // [m, n] of c_type, row stride ldc (16-byte rows), written
  int64_t ldc = 0;
  GemmType c_type = GemmType::kBFloat16;
  float alpha = 1.f;
  const void* bias = nullptr;  // [n] of c_type (bf16 or fp16 only), contiguous
  bool fast_accum = false;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

// Whether the current device has FP8 tensor cores (compute capability 8.9 or newer).
bool gemm_fp8_supported_device();

// Queues the FP8 GEMM on args.stream on the current device. Throws td::Error for invalid
// arguments (both operands E5M2, misaligned leading dimensions, a bias with an fp32 output, a
// device without FP8) or naming the problem when cuBLASLt has no algorithm for it.
void gemm_fp8(const Fp8GemmArgs& args);

// The workspace size that lets cuBLASLt pick its fastest kernels on the current device
// (32 MiB on sm_90 and newer, 8 MiB before).
size_t gemm_workspace_bytes();

// Queues the GEMM on args.stream on the current device. Throws td::Error for invalid
// arguments, or naming m, n, k, the dtype, transposes and epilogue when cuBLASLt has no
// algorithm for the problem. k == 0 gives C = beta*C + bias (then GELU), as BLAS does.
// Thread-safe; cuBLASLt handles (one per device) and heuristic results (per problem key) are
// cached.
void gemm(const GemmArgs& args);

}  // namespace td::kernels
