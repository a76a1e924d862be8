#pragma once
// Shared pieces of the data-parallel suites (test_data_parallel.cpp,
// test_distributed_optimizer.cpp): a small GPT, a deterministic global batch that every rank can
// build, and tolerance checks.
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
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/core/rng.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/models/gpt.h"
#include "tardelli/ops/factory.h"
#include "tardelli/optim/optim.h"

namespace td::distributed::dp_test {

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

}  // namespace td::distributed::dp_test
