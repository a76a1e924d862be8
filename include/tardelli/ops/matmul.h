#pragma once
// Matrix products through oneDNN on the CPU (fp32; bf16 and f16 inputs with fp32 accumulation,
// bf16 on AMX where the CPU has it). Any strides: transposed views are passed as strides, not
// copied.
#include <string>

#include "tardelli/core/tensor.h"

namespace td {

// torch.matmul semantics: 1-D x 1-D dot, 2-D x 2-D mm, and batched with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);   // [M,K] x [K,N]
Tensor bmm(const Tensor& a, const Tensor& b);  // [B,M,K] x [B,K,N]
// y = x W^T + b for x [..., in], W [out, in], b [out] (optional): one fused GEMM with bias.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// Whether fp32 products on CUDA may use TF32 tensor cores (fp32 range, 10-bit mantissa
// products, fp32 accumulation): faster, about 1e-3 relative error. Off by default, like
// torch.backends.cuda.matmul.allow_tf32. Process-wide; no effect on the CPU backend.
void set_matmul_allow_tf32(bool allow);
bool matmul_allow_tf32();

// The kernel that CPU matrix products of a floating dtype run on this machine: oneDNN's name for
// it (e.g. "gemm:jit" for fp32 on AVX2, "brg:avx512_core_amx" for bf16 on AMX), or, where oneDNN
// has no native kernel for the dtype, "fp32 widening" followed by what oneDNN offered: the
// operands are then converted to fp32, multiplied, and the result rounded back.
std::string cpu_matmul_kernel(DType dtype);
// The instruction set oneDNN's CPU kernels target here ("avx2", "avx512_core_bf16",
// "avx512_core_amx", ...): the CPU's, capped by ONEDNN_MAX_CPU_ISA and by what the OS allows.
std::string cpu_isa();

}  // namespace td
