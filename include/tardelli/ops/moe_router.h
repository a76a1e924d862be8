#pragma once
// The router of a mixture-of-experts layer: softmax top-k gating, its balancing losses, and the
// auxiliary-loss-free expert bias (DeepSeek-V3).
//
// Note [MoE routing]: logits = x W_r^T in fp32 (a bf16 router flips top-k choices between
// nearly equal experts), probs = softmax(logits) over the E experts. The K experts of a token
// are the K largest selection scores probs + expert_bias (expert_bias: zeros unless the
// aux-loss-free balancing moved it); equal scores go to the lower expert index, so routing is a
// pure function of its inputs. The gate weights are the unbiased probs of the chosen experts,
// divided by their sum when norm_topk and top_k > 1 (Mixtral, DeepSeek-V3). Top-1 routing keeps
// the probability itself (Switch): normalized, every gate would be 1 and the router would learn
// from the balancing losses only.
#include <cstdint>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td {

// The indices of the k largest entries of each row of scores [T, E] (floating), in descending
// order of score, equal scores in ascending index order: int64 [T, k] on scores' device (computed
// on a host copy). Not differentiable. td::Error naming the values when k is not in [1, E] or a
// score is NaN.
Tensor moe_topk(const Tensor& scores, int64_t k);

struct MoERouting {
  Tensor logits;        // [T, E] fp32 (differentiable)
  Tensor probs;         // [T, E] fp32: softmax(logits) (differentiable)
  Tensor expert_index;  // int64 [T, K]: the chosen experts, best first
  Tensor gates;         // [T, K] fp32: their gate weights (differentiable)
};

// Routes x [T, d] (any floating dtype) with router weight [E, d] (Note [MoE routing]).
// expert_bias: fp32 [E] added to probs for the selection only, or undefined (none).
MoERouting moe_route(const Tensor& x, const Tensor& weight, int64_t top_k,
                     const Tensor& expert_bias = Tensor(), bool norm_topk = true);

// The Switch/GShard load-balancing loss E * sum_e f_e * P_e, with f_e = tokens_per_expert[e] /
// (T * top_k) the fraction of routed token-slots that chose e and P_e = mean_t probs[t, e].
// 1 when both are uniform. fp32 scalar, differentiable in probs [T, E] (f is a count).
Tensor moe_aux_loss(const Tensor& probs, const std::vector<int64_t>& tokens_per_expert,
                    int64_t top_k);

// The ST-MoE router z-loss: mean over tokens of logsumexp(logits[t])^2 for logits [T, E]. fp32
// scalar, differentiable.
Tensor moe_z_loss(const Tensor& logits);

// Aux-loss-free balancing (DeepSeek-V3): expert_bias[e] += rate * sign(mean_e(load) - load[e])
// for the token-slot counts `load` [E] (an expert above the mean load gets less likely to be
// chosen). In place on the fp32 [E] tensor, not recorded by autograd.
void moe_update_expert_bias(const Tensor& expert_bias, const std::vector<int64_t>& load,
                            double rate);

}  // namespace td
