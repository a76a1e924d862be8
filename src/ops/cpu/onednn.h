#pragma once
// oneDNN glue for the CPU matrix products (internal header): one engine for the process, a
// stream per thread, and a matmul that passes any strided view to oneDNN without copying when
// oneDNN can express the layout.
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "tardelli/core/tensor.h"

namespace td::cpu {

dnnl::engine& onednn_engine();
dnnl::stream& onednn_stream();

// Whether oneDNN has a matmul implementation for this dtype on this CPU (bf16 and f16 need
// AVX-512/AMX in oneDNN 2.6). Detected once per dtype by creating a primitive descriptor.
bool onednn_has_matmul(DType t);

// oneDNN's name for the implementation a matmul of this dtype dispatches to on this CPU (e.g.
// "gemm:jit", "brg:avx512_core_amx"; "ref:any" for its reference loop), or "" if it has none
// (Note [Matmul kernel probe]).
std::string onednn_matmul_impl(DType t);

// The instruction set oneDNN's JIT kernels target on this machine ("avx2", "avx512_core_amx",
// ...): the CPU's, capped by ONEDNN_MAX_CPU_ISA and by what the OS lets the process use (AMX
// needs Linux >= 5.16).
std::string onednn_cpu_isa();

// out[batch..., M, N] = a[batch..., M, K] @ b[batch..., K, N] (+ bias[N]).
// a, b and out have the same ndim (2..12); each batch dim of a and b equals out's or is 1 (or
// has stride 0: broadcast). a and b may have any strides; out must be contiguous. All tensors
// share one dtype with onednn_has_matmul(dtype). K may be 0 (out = bias or zeros). Not recorded
// by autograd.
void onednn_matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out);

// Number of distinct primitives created so far (for tests of the cache).
int64_t onednn_primitives_created();

}  // namespace td::cpu
