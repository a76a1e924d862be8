#include "tardelli/ops/moe_dispatch.h"

#include <cmath>

#include "ops/common.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"
#include "tardelli/ops/view.h"

namespace td {

MoEDispatch moe_dispatch(const Tensor& expert_index, int64_t num_experts, int64_t capacity,
                         Device device) {
  const char* op = "moe_dispatch";
  ops::check_defined(expert_index, op, "expert_index");
  TD_CHECK(expert_index.dim() == 2 && is_integral(expert_index.dtype()), op,
           ": expert_index must be int64/int32 [tokens, top_k], got ", describe(expert_index));
  TD_CHECK(num_experts >= 1, op, ": num_experts must be >= 1, got ", num_experts);
  TD_CHECK(capacity >= -1, op, ": capacity must be >= 0 (or -1: dropless), got ", capacity);
  MoEDispatch d;
  d.num_tokens = expert_index.size(0);
  d.top_k = expert_index.size(1);
  d.num_experts = num_experts;
  d.capacity = capacity;
  const std::vector<int64_t> idx = to_vector<int64_t>(expert_index);
  const auto E = static_cast<size_t>(num_experts);
  d.routed_per_expert.assign(E, 0);
  for (size_t i = 0; i < idx.size(); ++i) {
    TD_CHECK(idx[i] >= 0 && idx[i] < num_experts, op, ": expert index ", idx[i], " (token ",
             static_cast<int64_t>(i) / d.top_k, ", slot ", static_cast<int64_t>(i) % d.top_k,
             ") is out of range for ", num_experts, " experts");
    ++d.routed_per_expert[static_cast<size_t>(idx[i])];
  }
  // A counting sort by expert; the scan in (token, slot) order keeps it stable.
  d.tokens_per_expert = d.routed_per_expert;
  std::vector<int64_t> next(E, 0);
  int64_t rows = 0;
  for (size_t e = 0; e < E; ++e) {
    if (capacity >= 0 && d.tokens_per_expert[e] > capacity) {
      d.dropped += d.tokens_per_expert[e] - capacity;
      d.tokens_per_expert[e] = capacity;
    }
    next[e] = rows;
    rows += d.tokens_per_expert[e];
  }
  std::vector<int64_t> token(static_cast<size_t>(rows)), slot(static_cast<size_t>(rows));
  std::vector<int64_t> end(E);
  for (size_t e = 0; e < E; ++e) end[e] = next[e] + d.tokens_per_expert[e];
  for (size_t i = 0; i < idx.size(); ++i) {
    const auto e = static_cast<size_t>(idx[i]);
    if (next[e] == end[e]) continue;  // beyond the capacity: dropped
    const auto r = static_cast<size_t>(next[e]++);
    token[r] = static_cast<int64_t>(i) / d.top_k;
    slot[r] = static_cast<int64_t>(i);
  }
  d.token_of_row = from_vector<int64_t>(token, {rows}).to(device);
  d.slot_of_row = from_vector<int64_t>(slot, {rows}).to(device);
  return d;
}

int64_t moe_capacity(double capacity_factor, int64_t num_tokens, int64_t top_k,
                     int64_t num_experts) {
  TD_CHECK(capacity_factor > 0 && std::isfinite(capacity_factor),
           "moe_capacity: capacity_factor must be > 0, got ", capacity_factor);
  TD_CHECK(num_tokens >= 0 && top_k >= 1 && num_experts >= 1, "moe_capacity: invalid sizes (",
           num_tokens, " tokens, top_k ", top_k, ", ", num_experts, " experts)");
  const double c =
      capacity_factor * static_cast<double>(num_tokens * top_k) / static_cast<double>(num_experts);
  return static_cast<int64_t>(std::ceil(c));
}

Tensor moe_permute(const Tensor& x, const MoEDispatch& d) {
  const char* op = "moe_permute";
  ops::check_defined(x, op, "input");
  TD_CHECK(x.dim() == 2 && x.size(0) == d.num_tokens, op, ": input must be [", d.num_tokens,
           ", features] (the dispatch's tokens), got ", describe(x));
  return index_select(x, 0, d.token_of_row);
}

Tensor moe_unpermute(const Tensor& rows, const Tensor& gates, const MoEDispatch& d) {
  const char* op = "moe_unpermute";
  ops::check_defined(rows, op, "rows");
  ops::check_floating(rows, op);
  TD_CHECK(rows.dim() == 2 && rows.size(0) == d.num_rows(), op, ": rows must be [", d.num_rows(),
           ", features] (the dispatch's kept rows), got ", describe(rows));
  Tensor w = rows;
  if (gates.defined()) {
    ops::check_floating(gates, op);
    ops::check_same_device(rows, gates, op);
    TD_CHECK(gates.dim() == 2 && gates.size(0) == d.num_tokens && gates.size(1) == d.top_k, op,
             ": gates must be [", d.num_tokens, ", ", d.top_k, "] (tokens, top_k), got ",
             describe(gates));
    Tensor g = index_select(gates.reshape({d.num_tokens * d.top_k}), 0, d.slot_of_row);
    w = mul(rows, g.unsqueeze(1));
  }
  Tensor y =
      index_add(zeros({d.num_tokens, rows.size(1)}, {w.dtype(), w.device()}), 0, d.token_of_row, w);
  return y.dtype() == rows.dtype() ? y : to_dtype(y, rows.dtype());
}

}  // namespace td
