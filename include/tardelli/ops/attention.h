#pragma once
// Scaled dot-product attention. q: [B, H, Tq, D], k/v: [B, Hkv, Tk, D] with H a multiple of Hkv
// (grouped-query attention). The fused path (no mask tensor) is blocked with an online softmax
// (FlashAttention's algorithm): memory is O(T*D) per head, never O(T^2); the backward recomputes
// the probabilities block by block from the saved per-row logsumexp.
#include <optional>

#include "tardelli/core/tensor.h"

namespace td {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

// The fused kernels. Causal masking aligns the last query with the last key (Tq <= Tk).
struct AttentionForward {
  Tensor out;  // [B, H, Tq, D], dtype of q; on the CPU a view of a [B, Tq, H, D] buffer
  Tensor lse;  // [B, H, Tq] fp32 logsumexp of the scaled scores
};
AttentionForward flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         bool is_causal, double scale);
// Returns {dq, dk, dv}.
std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out,
                                                            const Tensor& q, const Tensor& k,
                                                            const Tensor& v, const Tensor& out,
                                                            const Tensor& lse, bool is_causal,
                                                            double scale);

}  // namespace td
