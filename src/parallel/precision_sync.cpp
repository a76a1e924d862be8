#include "tardelli/parallel/precision_sync.h"

#include <cmath>

#include "tardelli/ops/factory.h"

namespace td::parallel {

namespace dist = td::distributed;

namespace {

bool many(const dist::CommPtr& g) {
  return g != nullptr && g->size() > 1;
}

}  // namespace

// Note [Amax reduction].
void sync_fp8_amaxes(models::GPT& model, const dist::CommPtr& group) {
  auto& states = model.fp8_states();
  if (states.empty()) return;
  if (!many(group)) {
    model.commit_fp8();
    return;
  }
  std::vector<float> pending;
  pending.reserve(3 * states.size());
  for (auto& s : states) {
    // -1: nothing noted here. An amax is a float32 |value| (exact), +inf for non-finite ones.
    for (const Fp8Scaling* sc : {&s.input, &s.weight, &s.grad})
      pending.push_back(static_cast<float>(sc->pending()));
  }
  Tensor t = from_vector<float>(pending, {static_cast<int64_t>(pending.size())});
  group->all_reduce(t, dist::ReduceOp::Max);
  const std::vector<float> all = to_vector<float>(t);
  for (size_t i = 0; i < states.size(); ++i) {
    states[i].input.commit(all[3 * i]);
    states[i].weight.commit(all[3 * i + 1]);
    states[i].grad.commit(all[3 * i + 2]);
  }
}

std::vector<models::LinearStats> reduce_linear_stats(const models::GPT& model,
                                                     const dist::CommPtr& group) {
  std::vector<models::LinearStats> stats = model.block_linears().stats();
  if (!many(group) || stats.empty()) return stats;
  std::vector<int64_t> counts;
  std::vector<float> errors;
  for (const auto& s : stats) {
    counts.insert(counts.end(), {s.fp8.values, s.fp8.overflow, s.fp8.underflow, s.nonfinite});
    // Rounded to float32 on each rank before the max: every rank then holds the same value.
    errors.insert(errors.end(),
                  {static_cast<float>(s.fp8_error), static_cast<float>(s.bf16_error)});
  }
  Tensor c = from_vector<int64_t>(counts, {static_cast<int64_t>(counts.size())});
  Tensor e = from_vector<float>(errors, {static_cast<int64_t>(errors.size())});
  group->all_reduce(c, dist::ReduceOp::Sum);
  group->all_reduce(e, dist::ReduceOp::Max);
  const std::vector<int64_t> cs = to_vector<int64_t>(c);
  const std::vector<float> es = to_vector<float>(e);
  for (size_t i = 0; i < stats.size(); ++i) {
    stats[i].fp8 = {cs[4 * i], cs[4 * i + 1], cs[4 * i + 2]};
    stats[i].nonfinite = cs[4 * i + 3];
    stats[i].fp8_error = es[2 * i];
    stats[i].bf16_error = es[2 * i + 1];
  }
  return stats;
}

std::vector<models::PrecisionChange> precision_step(models::GPT& model,
                                                    models::PrecisionPolicy* policy,
                                                    const dist::CommPtr& group) {
  sync_fp8_amaxes(model, group);
  if (policy == nullptr) return {};
  models::BlockLinears& linears = model.block_linears();
  TD_CHECK(policy->names() == model.linear_names(), "precision_step: the policy's ",
           policy->names().size(), " linears are not this model's ", linears.size());
  std::vector<models::PrecisionChange> changes;
  if (linears.monitor()) changes = policy->update(reduce_linear_stats(model, group));
  linears.set_precisions(policy->precisions());
  linears.reset_stats();
  return changes;
}

}  // namespace td::parallel
