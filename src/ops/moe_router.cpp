#include "tardelli/ops/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/common.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/softmax.h"
#include "tardelli/ops/view.h"

namespace td {

namespace {

// Row-wise top-k of host scores [T, E] (see moe_topk).
std::vector<int64_t> topk_rows(const std::vector<float>& s, int64_t T, int64_t E, int64_t k,
                               const char* op) {
  std::vector<int64_t> out(static_cast<size_t>(T * k));
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = s.data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      TD_CHECK(!std::isnan(row[e]), op, ": score of token ", t, ", expert ", e, " is NaN");
    }
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int64_t a, int64_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    std::copy(order.begin(), order.begin() + k, out.begin() + t * k);
  }
  return out;
}

void check_top_k(int64_t k, int64_t E, const char* op) {
  TD_CHECK(k >= 1 && k <= E, op, ": top_k must be in [1, num_experts = ", E, "], got top_k ", k);
}

Tensor as_f32(const Tensor& t) {
  return t.dtype() == DType::Float32 ? t : to_dtype(t, DType::Float32);
}

}  // namespace

Tensor moe_topk(const Tensor& scores, int64_t k) {
  const char* op = "moe_topk";
  ops::check_defined(scores, op, "scores");
  ops::check_floating(scores, op);
  TD_CHECK(scores.dim() == 2, op, ": scores must be [tokens, experts], got ", describe(scores));
  const int64_t T = scores.size(0), E = scores.size(1);
  check_top_k(k, E, op);
  const std::vector<int64_t> idx = topk_rows(to_vector<float>(scores), T, E, k, op);
  return from_vector<int64_t>(idx, {T, k}).to(scores.device());
}

MoERouting moe_route(const Tensor& x, const Tensor& weight, int64_t top_k,
                     const Tensor& expert_bias, bool norm_topk) {
  const char* op = "moe_route";
  ops::check_defined(x, op, "input");
  ops::check_defined(weight, op, "weight");
  ops::check_floating(x, op);
  TD_CHECK(x.dim() == 2, op, ": input must be [tokens, d], got ", describe(x));
  TD_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1), op,
           ": router weight must be [num_experts, ", x.size(1), "], got ", describe(weight));
  const int64_t T = x.size(0), E = weight.size(0);
  check_top_k(top_k, E, op);
  if (expert_bias.defined()) {
    TD_CHECK(
        expert_bias.dim() == 1 && expert_bias.size(0) == E && expert_bias.dtype() == DType::Float32,
        op, ": expert_bias must be float32 [", E, "], got ", describe(expert_bias));
  }
  MoERouting r;
  r.logits = linear(as_f32(x), as_f32(weight));
  r.probs = softmax(r.logits, 1);
  std::vector<int64_t> idx;
  {
    autograd::NoGradGuard ng;
    const Tensor scores = expert_bias.defined() ? add(r.probs.detach(), expert_bias.to(x.device()))
                                                : r.probs.detach();
    idx = topk_rows(to_vector<float>(scores), T, E, top_k, op);
  }
  std::vector<int64_t> flat(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    flat[i] = static_cast<int64_t>(i) / top_k * E + idx[i];
  }
  const Device dev = x.device();
  r.expert_index = from_vector<int64_t>(idx, {T, top_k}).to(dev);
  r.gates =
      index_select(r.probs.reshape({T * E}), 0, from_vector<int64_t>(flat, {T * top_k}).to(dev))
          .reshape({T, top_k});
  if (norm_topk && top_k > 1) r.gates = div(r.gates, sum(r.gates, {1}, /*keepdim=*/true));
  return r;
}

Tensor moe_aux_loss(const Tensor& probs, const std::vector<int64_t>& tokens_per_expert,
                    int64_t top_k) {
  const char* op = "moe_aux_loss";
  ops::check_defined(probs, op, "probs");
  TD_CHECK(probs.dim() == 2 && probs.size(1) == static_cast<int64_t>(tokens_per_expert.size()), op,
           ": probs must be [tokens, ", tokens_per_expert.size(), "] (one column per expert), got ",
           describe(probs));
  TD_CHECK(top_k >= 1, op, ": top_k must be >= 1, got ", top_k);
  const int64_t T = probs.size(0), E = probs.size(1);
  TD_CHECK(T > 0, op, ": no tokens");
  std::vector<float> f(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    f[static_cast<size_t>(e)] =
        static_cast<float>(static_cast<double>(tokens_per_expert[static_cast<size_t>(e)]) /
                           static_cast<double>(T * top_k));
  }
  const Tensor fe = from_vector<float>(f, {E}).to(probs.device());
  return mul(sum(mul(mean(as_f32(probs), {0}), fe)), static_cast<double>(E));
}

Tensor moe_z_loss(const Tensor& logits) {
  const char* op = "moe_z_loss";
  ops::check_defined(logits, op, "logits");
  TD_CHECK(logits.dim() == 2 && logits.size(0) > 0 && logits.size(1) > 0, op,
           ": logits must be a non-empty [tokens, experts], got ", describe(logits));
  const Tensor l = as_f32(logits);
  // logsumexp = m + log(sum(exp(l - m))) with the (constant) row maximum m: its gradient is the
  // softmax whatever m is, so m needs no gradient of its own.
  const Tensor m = amax(l.detach(), {1}, /*keepdim=*/true);
  const Tensor lse = add(log(sum(exp(sub(l, m)), {1})), m.reshape({l.size(0)}));
  return mean(mul(lse, lse));
}

void moe_update_expert_bias(const Tensor& expert_bias, const std::vector<int64_t>& load,
                            double rate) {
  const char* op = "moe_update_expert_bias";
  ops::check_defined(expert_bias, op, "expert_bias");
  const auto E = static_cast<int64_t>(load.size());
  TD_CHECK(
      expert_bias.dim() == 1 && expert_bias.size(0) == E && expert_bias.dtype() == DType::Float32,
      op, ": expert_bias must be float32 [", E, "] (one entry per load count), got ",
      describe(expert_bias));
  TD_CHECK(rate >= 0 && std::isfinite(rate), op, ": rate must be >= 0, got ", rate);
  if (E == 0 || rate == 0) return;
  const double mean_load =
      static_cast<double>(std::accumulate(load.begin(), load.end(), int64_t{0})) /
      static_cast<double>(E);
  std::vector<float> b = to_vector<float>(expert_bias);
  for (size_t e = 0; e < load.size(); ++e) {
    const double diff = mean_load - static_cast<double>(load[e]);
    const double sign = diff > 0 ? 1.0 : (diff < 0 ? -1.0 : 0.0);
    b[e] = static_cast<float>(b[e] + rate * sign);
  }
  autograd::NoGradGuard ng;
  copy_into(expert_bias, from_vector<float>(b, {E}));
}

}  // namespace td
