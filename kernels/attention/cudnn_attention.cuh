#pragma once
// Fused attention through cuDNN's SDPA graphs (the cuDNN frontend's graph API): host functions
// over raw pointers with the layout and masking of flash_attention.cuh (q, out, grad_out
// [B, H, Tq, D|Dv], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], contiguous; lse [B, H, Tq] fp32;
// causal bottom-right aligned). This header does not include cuDNN or the frontend, so the op
// glue, tests and benchmarks compile the same with or without the frontend.
//
// Note [cuDNN attention]: bf16/fp16 attention prefers cuDNN's fused flash attention (what torch's
// default SDPA backend runs on Hopper) and keeps Tardelli's own kernels (Note [Two attention
// paths]) as the fallback:
//   * Which path. src/ops/cuda/attention.cpp asks cudnn_attention_forward_plan /
//     cudnn_attention_backward_plan for the shape; the first ask builds the graph (validate,
//     build_operation_graph, heuristics mode A, check_support, build_plans) and caches it, or
//     caches the refusal and its reason, so a refused shape costs one map lookup afterwards.
//     fp32, head dims that are not multiples of 8 or above 256, pointers not 16-byte aligned,
//     a build without the frontend, and TD_CUDNN_ATTENTION=0 take the own kernels without
//     asking. TD_CUDNN_ATTENTION=1 makes a refusal an error instead (to see why on a GPU).
//   * The saved softmax statistic is one format. cuDNN's Stats output (generate_stats, natural
//     log, stats_use_log2 off) is max + ln(sum exp) of the scaled, masked scores of each query
//     row: the own kernels' lse. It is written straight into the [B, H, Tq] fp32 tensor (dims
//     [B, H, Tq, 1], strides [H Tq, Tq, 1, 1]), so a forward on one path and a backward on the
//     other agree (forward and backward choose independently; a shape the backward graph
//     refuses after the forward graph took it simply runs the own backward).
//   * Masking. Causal with Tq == Tk uses cuDNN's top-left diagonal (the same mask, and the form
//     every cuDNN 9 supports); Tq < Tk uses the bottom-right alignment, as the own kernels.
//   * Determinism. The backward asks for cuDNN's deterministic algorithm by default
//     (STYLE.md: deterministic reductions); TD_CUDNN_ATTENTION_DETERMINISTIC=0 allows the
//     atomics-based dQ that torch uses by default. A cuDNN that refuses the deterministic graph
//     falls back to the own (deterministic) backward.
//   * Caches are per thread and device: a cuDNN handle (cudnnSetStream before each execute) and
//     the graphs keyed by (device, dtype, B, H, Hkv, Tq, Tk, D, Dv, causal, scale bits, direction,
//     determinism). The workspace is a tensor from the caching allocator, sized by the graph.
//   * Dropout: the attention op has no dropout today, so the graphs have none.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "attention/flash_attention.cuh"

namespace td::kernels {

enum class AttentionDType { BFloat16, Float16 };
enum class AttentionBackend { None, Own, Cudnn };

// True when this build compiled the cuDNN frontend in (cmake found its headers).
bool cudnn_attention_compiled();

// Whether cuDNN runs (shape, dtype) on the current device, and with what workspace. Built on the
// first call for a key and cached (Note [cuDNN attention]); `refusal` says why not.
struct CudnnAttentionPlan {
  bool supported = false;
  size_t workspace_bytes = 0;
  std::string refusal;
};
const CudnnAttentionPlan& cudnn_attention_forward_plan(const AttentionShape& s, AttentionDType dt);
const CudnnAttentionPlan& cudnn_attention_backward_plan(const AttentionShape& s, AttentionDType dt,
                                                        bool deterministic);

// Run the graphs planned above (their plan must be supported); `workspace` holds at least the
// plan's workspace_bytes. A cuDNN failure is a td::Error naming the op and the shape.
void cudnn_attention_forward(const void* q, const void* k, const void* v, void* out, float* lse,
                             void* workspace, const AttentionShape& s, AttentionDType dt,
                             cudaStream_t stream);
void cudnn_attention_backward(const void* grad_out, const void* q, const void* k, const void* v,
                              const void* out, const float* lse, void* dq, void* dk, void* dv,
                              void* workspace, const AttentionShape& s, AttentionDType dt,
                              bool deterministic, cudaStream_t stream);

// Which implementation ran this thread's last attention forward / backward (recorded by the op
// glue; for tests and benchmarks).
void note_attention_backend(bool backward, AttentionBackend b);
AttentionBackend last_attention_backend(bool backward);

}  // namespace td::kernels
