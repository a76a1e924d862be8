#pragma once
// Fused attention (FlashAttention-2) forward and backward on CUDA: host launchers over raw
// pointers. Layout: q, out, grad_out [B, H, Tq, D|Dv], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], all
// contiguous; lse and delta [B, H, Tq] fp32. Grouped-query attention: query head h reads key/value
// head h / (H / Hkv). Causal masking is bottom-right aligned: query i sees keys j <= i + Tk - Tq
// (the caller guarantees Tq <= Tk then). Every launcher needs B, H, Hkv, Tq, Tk >= 1.
//
// Note [Two attention paths]: bf16/fp16 with D == Dv in {64, 128} and 16-byte aligned pointers
// take the tensor-core kernels (flash_attention_fwd.cu, flash_attention_bwd.cu: mma.sync
// m16n8k16 with fp32 accumulators, tiles streamed through shared memory by cp.async, online
// softmax in fp32 with exp2, causal tiles above the diagonal skipped). Everything else (fp32, any
// head dim up to kMaxRefHeadDim, Dv != D) takes the reference kernels (flash_attention.cu): one
// warp per query row (or key row in the dK/dV backward), fp32 throughout, obviously correct and
// the yardstick the tensor-core path is tested against. Both are deterministic: dQ comes from its
// own pass over the key tiles of each query tile, dK/dV from a pass over the query tiles of each
// key tile (summing the query heads of a GQA group in a fixed order), never from atomics.
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

inline constexpr int64_t kMaxRefHeadDim = 256;

struct AttentionShape {
  int64_t B = 0, H = 0, Hkv = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  bool causal = false;
  float scale = 1.0f;  // applied to q k^T before the softmax
};

// True when (T, shape, pointers) take the tensor-core kernels (Note [Two attention paths]).
template <typename T>
bool attention_uses_tensor_cores(const AttentionShape& s, const void* q, const void* k,
                                 const void* v, const void* out);

// out = softmax(scale q k^T (masked)) v and lse = the natural-log logsumexp of each row of
// scaled scores. `allow_tensor_cores = false` forces the reference kernels.
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, float* lse,
                       const AttentionShape& s, cudaStream_t stream,
                       bool allow_tensor_cores = true);

// Gradients of sum(out * grad_out) for q, k, v (dk, dv summed over the query heads of each
// kv head). `delta` is scratch of B * H * Tq floats (rowsum(grad_out * out)).
template <typename T>
void attention_backward(const T* grad_out, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, T* dq, T* dk, T* dv, float* delta,
                        const AttentionShape& s, cudaStream_t stream,
                        bool allow_tensor_cores = true);

// The tensor-core launchers (flash_attention_fwd.cu / flash_attention_bwd.cu); T is
// __nv_bfloat16 or __half, s.D == s.Dv in {64, 128}. Called by the two above.
template <typename T>
void attention_forward_tc(const T* q, const T* k, const T* v, T* out, float* lse,
                          const AttentionShape& s, cudaStream_t stream);
template <typename T>
void attention_backward_tc(const T* grad_out, const T* q, const T* k, const T* v, const float* lse,
                           const float* delta, T* dq, T* dk, T* dv, const AttentionShape& s,
                           cudaStream_t stream);

}  // namespace td::kernels
