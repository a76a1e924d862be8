#pragma once
// Shared pieces of the data-parallel suites (test_data_parallel.cpp,
// test_distributed_optimizer.cpp): a small GPT, a deterministic global batch that every rank can
// build, the single-process reference training step, and tolerance checks.
//
// Note [DP tolerance]: DDP's gradient is mean_r(grad of rank r's mean loss), the reference is the
// gradient of the mean loss over the whole batch in one process. Both are fp32 sums of the same
// per-token terms in a different order (per-rank partial sums, then the cross-rank sum), so they
// differ by a few fp32 roundings relative to the MAGNITUDE of the summed terms, not of the
// result: an element that nearly cancels has a large elementwise relative error. We therefore
// compare each tensor norm-wise, ||a - b|| <= rtol * ||b||, with rtol = 1e-5 (about 100 ulp of
// fp32 at the norm's scale). Measured at 2 and 4 ranks: at most 2.3e-6 (parameters after 5 AdamW
// steps, where Adam's normalization amplifies gradient rounding; gradients alone agree better).
// Any real mistake (a missing bucket, a wrong scale, a stale gradient) is O(1) relative.
// Training runs (several AdamW steps) use the llama architecture: gpt2's attention key bias has
// an exactly zero gradient (softmax is invariant to it), so its computed gradient is pure
// rounding noise, which Adam's m / sqrt(v) turns into +-lr steps of random sign: two correct
// implementations then disagree by O(lr) on those elements. Llama has no biases.
// The same amplification, milder, hits any element whose gradient is small next to its
// rounding: in the tiny llama h.0.attn.c_proj.weight's gradient spans 3.7e-6 to 3.4e-2 (median
// 4.1e-3). So the multi-step DDP test compares the synchronized GRADIENTS of the first step
// (same parameters on both sides) at rtol 1e-5 (a 4-way split of the batch measured 1.8e-7 at
// worst), and the PARAMETERS after the steps at kParamRtol = 1e-4: measured up to 1.4e-5 at 4
// ranks after the chunked LM head began forming its gradient in the forward (2.3e-6 before;
// both rounding-level), while a real mistake moves them by O(lr) = 3e-3 relative per step.
inline constexpr double kParamRtol = 1e-4;
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/core/rng.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/data_parallel.h"
#include "tardelli/models/gpt.h"
#include "tardelli/ops/factory.h"
#include "tardelli/optim/optim.h"

namespace td::distributed::dp_test {

// Rows of the global batch that each rank trains on.
inline constexpr int64_t kRowsPerRank = 2;

inline CommPtr world() {
  static CommPtr w = mpi_world(CommOptions{std::chrono::seconds(60), true});
  return w;
}

// 2 layers, d 64, vocab 128, seq 16: the GPT's parameter names give a realistic bucket split.
inline models::GPTConfig tiny_gpt_config(models::Arch arch = models::Arch::GPT2) {
  models::GPTConfig c;
  c.arch = arch;
  c.vocab_size = 128;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 64;
  c.seed = 7;
  return c;
}

inline std::shared_ptr<models::GPT> tiny_gpt(models::Arch arch = models::Arch::GPT2) {
  return std::make_shared<models::GPT>(tiny_gpt_config(arch));
}

// Rows [0, rows) of token ids and next-token targets for step `step`, identical on every rank.
struct Batch {
  Tensor idx, targets;
  Batch rows(int64_t start, int64_t n) const {
    return {idx.narrow(0, start, n).contiguous(), targets.narrow(0, start, n).contiguous()};
  }
};

inline Batch global_batch(int64_t rows, int64_t step) {
  Generator gen(1000 + static_cast<uint64_t>(step));
  Tensor tok = randint(0, 128, {rows, 17}, {DType::Int64, kCPU, false}, &gen);
  return {tok.narrow(1, 0, 16).contiguous(), tok.narrow(1, 1, 16).contiguous()};
}

inline double norm_diff_ratio(const Tensor& a, const Tensor& b) {
  std::vector<float> x = to_vector<float>(a), y = to_vector<float>(b);
  double d = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    d += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    n += static_cast<double>(y[i]) * y[i];
  }
  return n == 0 ? std::sqrt(d) : std::sqrt(d / n);
}

// Note [DP tolerance].
inline void expect_close(const Tensor& a, const Tensor& b, const std::string& what,
                         double rtol = 1e-5) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_LE(norm_diff_ratio(a, b), rtol) << what;
}

// Every bucket of `got` close to `want`'s (Note [DP tolerance]): the averaged gradient, or with
// reduce_scatter this rank's shard of it. Both DDPs must have the same buckets.
inline void expect_same_bucket_grads(const distributed::DistributedDataParallel& got,
                                     const distributed::DistributedDataParallel& want,
                                     const std::string& what) {
  ASSERT_EQ(got.buckets().size(), want.buckets().size()) << what;
  const bool shards = want.options().reduce_scatter;
  for (size_t b = 0; b < want.buckets().size(); ++b) {
    expect_close(shards ? got.shard_grad(b) : got.buckets()[b].buffer,
                 shards ? want.shard_grad(b) : want.buckets()[b].buffer,
                 what + " bucket " + std::to_string(b) + (shards ? " shard" : ""));
  }
}

// A DDP over `comm` with options `o` (reduce_scatter set from `zero`) and a plain one over
// `flat`, each on its own tiny GPT, run backward on this rank's rows of the same global batch
// (`step` seeds it); their bucket gradients (ZeRO-1: shards) must agree (Note [DP tolerance]).
inline void expect_same_grads_as_flat(const CommPtr& flat, const CommPtr& comm, DDPOptions o,
                                      bool zero, int64_t step) {
  const int r = flat->rank();
  Batch global = global_batch(kRowsPerRank * flat->size(), step);
  Batch local = global.rows(r * kRowsPerRank, kRowsPerRank);
  auto m1 = tiny_gpt(), m2 = tiny_gpt();
  o.reduce_scatter = zero;
  distributed::DistributedDataParallel plain(m1->named_parameters(), flat,
                                             {o.bucket_bytes, true, zero, true});
  distributed::DistributedDataParallel other(m2->named_parameters(), comm, o);
  m1->forward(local.idx, local.targets).backward();
  m2->forward(local.idx, local.targets).backward();
  plain.finish_grad_sync();
  other.finish_grad_sync();
  expect_same_bucket_grads(other, plain, zero ? "zero" : "all_reduce");
}

// torch-style AdamW groups from the model's (decay, no-decay) split.
inline std::vector<optim::ParamGroup> adamw_groups(const models::GPT& m, double wd) {
  std::vector<optim::ParamGroup> out;
  for (const auto& g : m.param_groups(wd)) {
    TensorList ps;
    for (const auto& np : g.params) ps.push_back(np.second);
    out.emplace_back(ps, std::nullopt, g.weight_decay);
  }
  return out;
}

// This rank's part of a data-parallel step: forward and backward on its kRowsPerRank rows of the
// global batch, then the gradient sync. Returns the local mean loss.
inline Tensor local_forward_backward(models::GPT& model, DistributedDataParallel& ddp,
                                     const Batch& global, int rank) {
  Batch local = global.rows(rank * kRowsPerRank, kRowsPerRank);
  Tensor loss = model.forward(local.idx, local.targets);
  loss.backward();
  ddp.finish_grad_sync();
  return loss;
}

// The loss and the gradient norm (before clipping) of one training step.
struct StepResult {
  double loss, grad_norm;
};

// One single-process reference step on the whole global batch: zero the gradients, mean loss,
// backward, clip_grad_norm_(max_norm), then opt.step().
inline StepResult reference_step(models::GPT& model, optim::AdamW& opt, const Batch& global,
                                 double max_norm) {
  opt.zero_grad(true);
  Tensor loss = model.forward(global.idx, global.targets);
  loss.backward();
  const double norm = optim::clip_grad_norm_(model.parameters(), max_norm);
  opt.step();
  return {loss.item_double(), norm};
}

// This rank's loss averaged over the ranks, and the data-parallel gradient norm, equal the
// reference step's (Note [DP tolerance]), and the reference norm exceeds max_norm (clipping bit).
inline void expect_step_matches(Communicator& comm, const Tensor& local_loss, double norm,
                                const StepResult& ref, double max_norm, const std::string& what) {
  Tensor l = local_loss.detach().clone().reshape({1});
  comm.all_reduce(l, ReduceOp::Avg);
  EXPECT_NEAR(l.item_double(), ref.loss, 1e-5 * ref.loss) << what;
  EXPECT_NEAR(norm, ref.grad_norm, 1e-5 * ref.grad_norm) << what;
  EXPECT_GT(ref.grad_norm, max_norm) << "clipping should be active";
}

// Every parameter's gradient matches the reference model's (Note [DP tolerance]).
inline void expect_grads_match(const models::GPT& model, const models::GPT& ref,
                               const std::string& what) {
  auto ref_params = ref.named_parameters();
  auto params = model.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    expect_close(params[i].second.grad(), ref_params[i].second.grad(),
                 params[i].first + " gradient, " + what);
  }
}

// Every parameter of `model` matches the reference model's (Note [DP tolerance]) and is bitwise
// identical on every rank.
inline void expect_params_match_and_replicated(Communicator& comm, const models::GPT& model,
                                               const models::GPT& ref) {
  auto ref_params = ref.named_parameters();
  auto params = model.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    expect_close(params[i].second, ref_params[i].second, params[i].first, kParamRtol);
    Tensor hi = params[i].second.detach().clone(), lo = hi.clone();
    comm.all_reduce(hi, ReduceOp::Max);
    comm.all_reduce(lo, ReduceOp::Min);
    EXPECT_EQ(to_vector<float>(hi), to_vector<float>(lo)) << params[i].first << " differs";
  }
}

}  // namespace td::distributed::dp_test
