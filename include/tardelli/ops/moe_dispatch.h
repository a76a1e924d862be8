#pragma once
// Token dispatch for a mixture-of-experts layer: each token's copies go to the experts its router
// chose, as rows grouped by expert (the input of grouped_linear, ops/grouped_linear.h), and come
// back combined with the gate weights.
//
// Note [MoE dispatch order]: the permuted rows are ordered by expert, and within an expert by
// token, then by the token's slot k (stable): expert e's rows are the contiguous range after
// experts 0..e-1's. With a capacity, each expert keeps its first `capacity` token-slots in that
// order and drops the rest (a dropped slot contributes nothing to its token's output).
#include <cstdint>
#include <vector>

#include "tardelli/core/device.h"
#include "tardelli/core/tensor.h"

namespace td {

// The plan of one dispatch (host-side sizes, device-side indices).
struct MoEDispatch {
  int64_t num_tokens = 0;
  int64_t top_k = 0;
  int64_t num_experts = 0;
  int64_t capacity = -1;  // rows an expert keeps at most; -1: dropless
  std::vector<int64_t>
      routed_per_expert;  // [E] token-slots routed to each expert (before capacity)
  std::vector<int64_t> tokens_per_expert;  // [E] rows kept per expert: the group sizes of the rows
  int64_t dropped = 0;                     // token-slots dropped by the capacity
  Tensor token_of_row;                     // int64 [N]: the token each permuted row copies
  Tensor slot_of_row;                      // int64 [N]: its slot t * top_k + k
  int64_t num_rows() const { return num_tokens * top_k - dropped; }
};

// Plans the dispatch of expert_index [T, K] (int64/int32; entry (t, k) is the expert of token t's
// k-th slot, in [0, num_experts)) in the order of Note [MoE dispatch order]. capacity >= 0 caps
// each expert's rows; -1 is dropless. The index tensors are created on `device`. td::Error
// naming the values for an expert index out of range, num_experts < 1 or capacity < -1.
MoEDispatch moe_dispatch(const Tensor& expert_index, int64_t num_experts, int64_t capacity = -1,
                         Device device = kCPU);

// ceil(capacity_factor * num_tokens * top_k / num_experts): an expert's capacity (GShard).
int64_t moe_capacity(double capacity_factor, int64_t num_tokens, int64_t top_k,
                     int64_t num_experts);

// x [T, d] -> rows [N, d], row r = x[token_of_row[r]]. Differentiable: a token's gradient is the
// sum of its rows' gradients (deterministic, in row order).
Tensor moe_permute(const Tensor& x, const MoEDispatch& dispatch);

// rows [N, d] and gates [T, K] -> [T, d]: y[t] = sum over t's kept slots k of
// gates[t, k] * rows[row of (t, k)], summed in row order; zeros for a token whose slots were all
// dropped. Undefined gates weigh every row 1 (so moe_unpermute(moe_permute(x), {}) is x times the
// number of kept slots, exactly). The products and the sum are taken in the promoted dtype of
// rows and gates (fp32 for bf16 rows with fp32 gates) and the result is rounded to rows' dtype.
// Differentiable in rows and gates (a dropped slot's gate gets a zero gradient).
Tensor moe_unpermute(const Tensor& rows, const Tensor& gates, const MoEDispatch& dispatch);

}  // namespace td
