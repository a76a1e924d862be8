// The training loop's mixture-of-experts bookkeeping, split from trainer.cpp.
//
// Note [MoE metrics]: the step's MoE statistics over its micro-batches (the model's statistics
// are reset at the step's start), data-parallel ranks and pipeline stages, and its mean
// cross-entropy. A training forward returns CE + sum over MoE layers of (aux_coeff x aux +
// z_coeff x z); the statistics hold each layer's unscaled aux and z summed over forwards, so the
// cross-entropy is loss_sum minus those terms (equal to the forward's CE up to fp32 rounding).
// The metrics: moe_aux_loss, moe_z_loss: unscaled, mean over layers and forwards (and dp
// ranks); moe_max_load: max over layers of the busiest expert's token-slots / the mean per
// expert (a ratio: 1.0 is perfect balance, E / top_k the worst); moe_mean_load: that ratio
// averaged over layers; moe_dropped_tokens: token-slots over capacity, summed over layers and
// dp ranks. Loads are counted over the whole global batch (summed over dp) before the capacity.
// Pipeline: the loss (from the last stage) holds the last stage's terms only (the others' are
// backpropagated apart: Note [MoE losses of a pipeline stage]), and the per-layer statistics
// are combined over the pp group.
//
// Note [MoE bias over dp]: the aux-loss-free bias step on the loads of the whole global batch:
// each rank's pending router loads are summed over the data-parallel group first, so every
// replica applies the same update (and the result equals a single-rank run's).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/join.h"
#include "tardelli/train/trainer.h"
#include "train_util.h"

namespace td::train::detail {

namespace dist = td::distributed;

std::vector<std::vector<int64_t>> sum_ints_over(const std::vector<std::vector<int64_t>>& rows,
                                                const dist::CommPtr& group) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  if (group == nullptr || group->size() == 1 || flat.empty()) return rows;
  Tensor t = from_vector<int64_t>(flat, {static_cast<int64_t>(flat.size())});
  group->all_reduce(t, dist::ReduceOp::Sum);
  const std::vector<int64_t> sums = to_vector<int64_t>(t);
  std::vector<std::vector<int64_t>> out;
  size_t at = 0;
  for (const auto& r : rows) {
    out.emplace_back(sums.begin() + static_cast<std::ptrdiff_t>(at),
                     sums.begin() + static_cast<std::ptrdiff_t>(at + r.size()));
    at += r.size();
  }
  return out;
}

MoEStep moe_step_metrics(const std::vector<std::shared_ptr<models::GPT>>& chunks, double loss_sum,
                         int64_t accum, const dist::CommPtr& dp, const dist::CommPtr& pp) {
  // Note [MoE metrics] (src/train/train_moe.cpp).
  const models::GPTConfig& cfg = chunks[0]->config();
  std::vector<const models::MoELayerStats*> layers;
  int64_t dropped = 0;
  double terms = 0.0;
  for (const auto& ch : chunks) {
    const models::MoEStats& st = ch->moe_stats();
    for (const auto& lay : st.layers) layers.push_back(&lay);
    dropped += st.dropped();
    if (ch->stage().post) {  // the chunk whose loss carries its layers' terms
      double s = 0.0;
      for (const auto& lay : st.layers) {
        s += cfg.moe_aux_loss_coeff * lay.aux_loss + cfg.moe_z_loss_coeff * lay.z_loss;
      }
      terms += s;
    }
  }
  std::vector<std::vector<int64_t>> rows;
  for (const auto* lay : layers) rows.push_back(lay->tokens_per_expert);
  rows.push_back({dropped});
  std::vector<std::vector<int64_t>> counts = sum_ints_over(rows, dp);
  dropped = counts.back()[0];
  counts.pop_back();
  std::vector<double> ratios;
  for (const auto& c : counts) {
    int64_t total = 0, most = 0;
    for (int64_t x : c) {
      total += x;
      most = std::max(most, x);
    }
    const double mean = static_cast<double>(total) / static_cast<double>(c.size());
    ratios.push_back(mean > 0 ? static_cast<double>(most) / mean : 0.0);
  }
  double aux = 0.0, z = 0.0, ratio_sum = 0.0;
  int64_t forwards = 0;
  for (const auto* lay : layers) aux += lay->aux_loss;
  for (const auto* lay : layers) z += lay->z_loss;
  for (const auto* lay : layers) forwards += lay->forwards;
  for (double r : ratios) ratio_sum += r;
  double max_ratio = ratios.empty() ? 0.0 : *std::max_element(ratios.begin(), ratios.end());
  // Python's values: ints until summed over pp (then floats).
  double n_forwards = static_cast<double>(forwards), n_layers = static_cast<double>(layers.size());
  double n_dropped = static_cast<double>(dropped);
  if (pp != nullptr && pp->size() > 1) {
    aux = dist::sum_over_ranks(aux, pp);
    z = dist::sum_over_ranks(z, pp);
    n_forwards = dist::sum_over_ranks(n_forwards, pp);
    n_layers = dist::sum_over_ranks(n_layers, pp);
    ratio_sum = dist::sum_over_ranks(ratio_sum, pp);
    terms = dist::sum_over_ranks(terms, pp);
    n_dropped = dist::sum_over_ranks(n_dropped, pp);
    Tensor t = full({1}, max_ratio, {DType::Float32});
    pp->all_reduce(t, dist::ReduceOp::Max);
    max_ratio = t.item<double>();
  }
  MoEStep out;
  out.lm_loss = (loss_sum - terms) / static_cast<double>(accum);
  out.metrics.aux_loss = n_forwards > 0 ? aux / n_forwards : 0.0;
  out.metrics.z_loss = n_forwards > 0 ? z / n_forwards : 0.0;
  out.metrics.max_load = max_ratio;
  out.metrics.mean_load = n_layers > 0 ? ratio_sum / n_layers : 0.0;
  out.metrics.dropped_tokens = static_cast<int64_t>(std::nearbyint(n_dropped));
  return out;
}

void update_moe_router_bias(models::GPT& model, const dist::CommPtr& dp) {
  // Note [MoE bias over dp]: every replica applies the update of the whole global batch's loads.
  model.moe_router_load() = sum_ints_over(model.moe_router_load(), dp);
  model.update_moe_router_bias();
}

bool moe_bias_replicated(const std::vector<std::shared_ptr<models::GPT>>& chunks,
                         const dist::CommPtr& dp) {
  TensorList biases;
  for (const auto& ch : chunks) {
    for (const auto& [name, b] : ch->named_buffers()) biases.push_back(b.reshape({-1}));
  }
  if (dp == nullptr || dp->size() == 1 || biases.empty()) return true;
  const Tensor flat = cat(biases, 0);
  Tensor hi = flat.clone(), lo = flat.clone();
  dp->all_reduce(hi, dist::ReduceOp::Max);
  dp->all_reduce(lo, dist::ReduceOp::Min);
  const std::vector<float> f = to_vector<float>(flat.to(DType::Float32));
  return to_vector<float>(hi.to(DType::Float32)) == f &&
         to_vector<float>(lo.to(DType::Float32)) == f;
}

}  // namespace td::train::detail
