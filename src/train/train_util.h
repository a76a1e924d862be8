#pragma once
// Small helpers the training loop's source files share (src/train/trainer*.cpp and
// train_metrics.cpp); not part of the public API.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/distributed/communicator.h"
#include "tardelli/train/trainer.h"

namespace td::models {
class GPT;
}

namespace td::train::detail {

// Wall clock (seconds since the epoch) and a monotonic clock (seconds).
double now_s();
double perf_s();

// printf-style formatting of one number as Python's format() spells it: "nan", "inf" and
// "-inf" for the non-finite values (C's printf may write "-nan").
std::string fmt(const char* f, double v);

// Python's f"{v:,.0f}": rounded, with thousands separators.
std::string with_commas(double v);

// Model FLOPs of one training step of chunk `m` on batch x seq tokens (GPT.flops_per_step in
// python/tardelli/models.py: 6 x tokens x matmul weights + causal attention), and its
// parameters counted at their full (logical) shapes.
double chunk_flops(const models::GPT& m, int64_t batch, int64_t seq);
int64_t logical_params(const models::GPT& m);

// Whether parameter `name` of `m` counts in the global gradient norm on this rank: split over tp
// (every tp rank holds a part), or replicated and this is tp rank 0; a pipeline stage's copy of
// the tied embedding never (model_parallel._counts).
bool counts_in_norm(const models::GPT& m, const std::string& name, bool tp);

// ---- mixture of experts (src/train/train_moe.cpp) ----

// Lists of ints summed elementwise over `group` (one all-reduce; unchanged without a group).
std::vector<std::vector<int64_t>> sum_ints_over(const std::vector<std::vector<int64_t>>& rows,
                                                const distributed::CommPtr& group);

struct MoEStep {
  double lm_loss = 0;  // the step's mean cross-entropy: the loss less the MoE terms
  MoEMetrics metrics;  // aux and z not yet averaged over the world
};
// Note [MoE metrics] (src/train/train_moe.cpp): the step's statistics over its
// micro-batches, the data-parallel ranks `dp` and the pipeline stages `pp` (null: none).
MoEStep moe_step_metrics(const std::vector<std::shared_ptr<models::GPT>>& chunks, double loss_sum,
                         int64_t accum, const distributed::CommPtr& dp,
                         const distributed::CommPtr& pp);
// Note [MoE bias over dp]: the pending router loads summed over dp, then the bias step.
void update_moe_router_bias(models::GPT& model, const distributed::CommPtr& dp);
// Whether the expert biases are bitwise equal on every rank of `dp` (a collective).
bool moe_bias_replicated(const std::vector<std::shared_ptr<models::GPT>>& chunks,
                         const distributed::CommPtr& dp);

}  // namespace td::train::detail
