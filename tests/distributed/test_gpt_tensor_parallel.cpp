// The GPT laid out by td::parallel::apply_tensor_parallel (tp = the world: 2 and 4 ranks) against
// the one-device GPT built from the same config on the same rank (Note [GPT tensor-parallel
// layout] in models/gpt_parallelism.h), for gpt2 and llama (n_kv_head = tp: GQA at 2 ranks, one
// kv head per rank at 4), with sequence parallelism off and on: the loss, every parameter's
// gradient (each rank's shard all-gathered and put into the full tensor with every rank's
// ShardSpec), the logits and greedy generation. The vocabulary (37) is padded to a multiple of
// tp (make_vocab_size_divisible_by 1: 38 at tp=2, 40 at tp=4), so a rank holds padding rows.
//
// Tolerances (fp32; the model is tiny: d=32, 2 layers, 16 tokens). The tp model computes the
// same sums as the one-device model but associates them differently: a row-parallel output is
// an all-reduce (or reduce-scatter) of tp partial products, the vocab-parallel loss combines
// per-rank maxima and sums of exponentials, and oneDNN blocks a shard's GEMM differently from the
// full one. Each such sum carries a relative rounding of a few fp32 ulps (6e-8) of its terms'
// magnitudes, and they compound through the 2 layers:
//   - loss, relative 1e-6: the loss is a mean of per-token cross-entropies, each of which moves by
//     at most 2 max|d logit| (its gradient softmax - onehot has L1 norm <= 2), with logits of
//     magnitude <= 0.6 perturbed by ~1e-7 relative; measured: <= 6.6e-8 relative (one ulp of
//     the loss, ~3.6), at 2 and 4 ranks. A layout bug (a misplaced head, a missing all-reduce, a
//     padded row in the softmax) moves it by orders of magnitude more.
//   - gradients, |got - want| <= 1e-5 * max|want| per tensor (the bound the layer tests use):
//     backward adds a second round of re-associated sums (the all-reduced input gradients of
//     column-parallel layers, the reduced norm-weight gradients under sequence parallelism);
//     measured worst case 7.6e-7 (a LayerNorm bias), 13x below the bound.
//   - logits, 1e-5 * max|want| (measured <= 2e-7); greedy tokens exactly: the smallest gap
//     between the two largest logits of any generated position is 2.7e-3 (llama; 1.5e-2 gpt2),
//     four orders above the logit error, so no argmax can flip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/core/error.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/models/gpt.h"
#include "tardelli/ops/factory.h"
#include "tardelli/parallel/parallelize.h"

#include "distributed/parallel_test_util.h"
#include "test_util.h"

namespace td::parallel {
namespace {

using namespace td::parallel_test;

using distributed::CommPtr;
using models::Arch;
using models::GPT;
using models::GPTConfig;
using td::test::error_of;

CommPtr tp_group() {
  static CommPtr w = distributed::mpi_world();  // tp = the whole world
  return w;
}

GPTConfig tiny_config(Arch arch, int tp) {
  GPTConfig c;
  c.arch = arch;
  c.vocab_size = 37;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = arch == Arch::Llama ? tp : 0;
  c.d_model = 32;
  c.seed = 1234;
  return c;
}

ParallelOptions options(bool sequence_parallel) {
  ParallelOptions o;
  o.sequence_parallel = sequence_parallel;
  o.make_vocab_size_divisible_by = 1;  // pad to a multiple of tp only: 37 -> 38 / 40
  return o;
}

// [B, T] token ids in [0, vocab), the same on every rank.
Tensor tokens(int64_t B, int64_t T, uint64_t seed) {
  Generator g(seed);
  return randint(0, 37, {B, T}, {DType::Int64}, &g);
}

// The full tensor of which `shard` is this rank's piece under `spec` (collective over tp): every
// rank's shard is all-gathered and put into its place with that rank's spec.
Tensor gather_full(const Tensor& shard, const nn::ShardSpec& spec, const Shape& full_shape,
                   const CommPtr& tp) {
  const int n = tp->size();
  Tensor mine = shard.detach().contiguous();
  Tensor all = Tensor::empty({n * mine.numel()}, mine.dtype());
  tp->all_gather(all, mine);
  Tensor full = zeros(full_shape);
  for (int r = 0; r < n; ++r) {
    nn::ShardSpec s = spec;
    s.index = r;
    s.put(all.narrow(0, r * mine.numel(), mine.numel()).view(mine.sizes()), full);
  }
  return full;
}

constexpr double kLossRel = 1e-6;
constexpr double kGradRel = 1e-5;
constexpr double kLogitRel = 1e-5;

// Property: the tp (and sp) GPT computes the one-device GPT's loss, gradients, logits and greedy
// tokens; its parameters are exactly the one-device parameters' shards.
void check_matches_one_device(Arch arch, bool sequence_parallel) {
  CommPtr tp = tp_group();
  const GPTConfig cfg = tiny_config(arch, tp->size());
  const std::string tag = std::string(models::arch_name(arch)) + (sequence_parallel ? " sp" : "");
  Tensor idx = tokens(2, 8, 11), targets = tokens(2, 8, 12);
  targets.data_ptr<int64_t>()[5] = models::kIgnoreIndex;  // one ignored position

  auto dense = std::make_shared<GPT>(cfg);
  Tensor dense_loss = dense->forward(idx, targets);
  dense_loss.backward();

  auto model = std::make_shared<GPT>(cfg);
  apply_tensor_parallel(*model, tp, options(sequence_parallel));
  ASSERT_NE(model->parallelism(), nullptr) << tag;
  EXPECT_EQ(model->parallelism()->sequence_parallel(), sequence_parallel) << tag;
  Tensor loss = model->forward(idx, targets);
  loss.backward();

  const double want = dense_loss.item<float>(), got = loss.item<float>();
  EXPECT_NEAR(got, want, kLossRel * std::fabs(want)) << tag << " loss";

  std::map<std::string, Tensor> dense_params;
  for (auto& [name, p] : dense->named_parameters()) dense_params[name] = p;
  const nn::NamedTensors params = model->named_parameters();
  ASSERT_EQ(params.size(), dense_params.size()) << tag;
  int sharded = 0;
  for (const auto& [name, p] : params) {
    SCOPED_TRACE(tag + " " + name);
    ASSERT_TRUE(dense_params.count(name)) << "no such parameter in the one-device model";
    const Tensor& dp = dense_params[name];
    const nn::ShardSpec spec = model->shard_spec(name);
    EXPECT_EQ(model->full_shape(name), dp.sizes());
    // Layout-independent init: the shard is exactly the slice of the one-device parameter.
    expect_close(p, spec.take(dp), 0.0, "parameter shard");
    ASSERT_TRUE(p.grad().defined());
    if (spec.replicated()) {
      expect_close(p.grad(), dp.grad(), kGradRel, "replicated gradient");
    } else {
      ++sharded;
      expect_close(gather_full(p.grad(), spec, dp.sizes(), tp), dp.grad(), kGradRel,
                   "gathered gradient");
    }
  }
  // wte, and per layer c_attn (+bias), attn c_proj, c_fc (+bias), mlp c_proj; llama's lm_head.
  EXPECT_EQ(sharded, arch == Arch::GPT2 ? 1 + 2 * 6 : 2 + 2 * 4) << tag;

  {
    autograd::NoGradGuard ng;
    expect_close(model->forward(idx), dense->forward(idx), kLogitRel, tag + " logits");
  }
  Tensor prompt = idx.narrow(1, 0, 4).contiguous();
  Tensor want_tokens = dense->generate(prompt, 6, /*temperature=*/0.0);
  Tensor got_tokens = model->generate(prompt, 6, /*temperature=*/0.0);
  EXPECT_EQ(to_vector<int64_t>(got_tokens), to_vector<int64_t>(want_tokens)) << tag << " generate";
}

TEST(GPTTensorParallel, Gpt2MatchesOneDevice) {
  check_matches_one_device(Arch::GPT2, false);
}
TEST(GPTTensorParallel, Gpt2SequenceParallelMatchesOneDevice) {
  check_matches_one_device(Arch::GPT2, true);
}
TEST(GPTTensorParallel, LlamaMatchesOneDevice) {
  check_matches_one_device(Arch::Llama, false);
}
TEST(GPTTensorParallel, LlamaSequenceParallelMatchesOneDevice) {
  check_matches_one_device(Arch::Llama, true);
}

// Property: layouts that do not fit are td::Errors naming the config field (or the sequence
// length), raised on every rank before any communication, so the group stays in step.
TEST(GPTTensorParallel, BadLayoutsRaise) {
  CommPtr tp = tp_group();
  const int n = tp->size();

  GPTConfig kv = tiny_config(Arch::Llama, n);
  kv.n_kv_head = 1;  // 4 query heads share one kv head: cannot split over tp >= 2
  std::string msg = error_of([&] {
    auto m = std::make_shared<GPT>(kv);
    apply_tensor_parallel(*m, tp, options(false));
  });
  EXPECT_NE(
      msg.find("n_kv_head 1 is not divisible by the tensor-parallel size " + std::to_string(n)),
      std::string::npos)
      << msg;

  GPTConfig heads = tiny_config(Arch::GPT2, n);
  heads.n_head = n + 1;  // 3 at tp=2, 5 at tp=4
  heads.d_model = 8 * (n + 1);
  msg = error_of([&] {
    auto m = std::make_shared<GPT>(heads);
    apply_tensor_parallel(*m, tp, options(false));
  });
  EXPECT_NE(msg.find("n_head " + std::to_string(n + 1) + " is not divisible"), std::string::npos)
      << msg;

  // Twice: the first layout stays installed.
  auto twice = std::make_shared<GPT>(tiny_config(Arch::GPT2, n));
  apply_tensor_parallel(*twice, tp, options(false));
  msg = error_of([&] { apply_tensor_parallel(*twice, tp, options(false)); });
  EXPECT_NE(msg.find("GPT.set_parallelism"), std::string::npos) << msg;
  EXPECT_NE(msg.find("already installed"), std::string::npos) << msg;
  EXPECT_EQ(twice->parallelism()->tp_size(), n);

  // Sequence parallelism with a sequence length that tp does not divide.
  auto sp = std::make_shared<GPT>(tiny_config(Arch::GPT2, n));
  apply_tensor_parallel(*sp, tp, options(true));
  const int64_t T = 2 * n + 1;
  msg = error_of([&] { sp->forward(tokens(2, T, 13), tokens(2, T, 14)); });
  EXPECT_NE(msg.find("sequence length"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(T) + " positions"), std::string::npos) << msg;
  // The model still runs at a divisible length (the error left the ranks in step).
  autograd::NoGradGuard ng;
  EXPECT_TRUE(std::isfinite(sp->forward(tokens(2, 2 * n, 15), tokens(2, 2 * n, 16)).item<float>()));

  // Sequence parallelism needs tp > 1: a one-rank group refuses it.
  CommPtr solo = tp->split(tp->rank(), 0, "solo");
  auto one = std::make_shared<GPT>(tiny_config(Arch::GPT2, n));
  msg = error_of([&] { apply_tensor_parallel(*one, solo, options(true)); });
  EXPECT_NE(msg.find("sequence parallelism needs tensor parallelism"), std::string::npos) << msg;
}

}  // namespace
}  // namespace td::parallel
