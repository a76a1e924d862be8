// The GPT laid out by td::parallel::apply_parallelism with cp = the world (2 and 4 ranks, tp 1)
// against the one-device GPT built from the same config on the same rank, for gpt2 and llama
// (GQA: n_kv_head = cp), ring and all-to-all: each rank feeds its zigzag tokens; the loss must be
// the one-device loss (the cp mean of the ranks' means), and each parameter's gradient averaged
// over cp (what the dp x cp reduction does) must be the one-device gradient.
//
// Tolerances (fp32, d=32, 2 layers, 16 tokens): the loss to 1e-6 relative (a mean of means
// instead of one mean, attention merged from blocks: a few ulps of a ~3.6 loss); gradients to
// 1e-5 of each tensor's largest magnitude (the bound of the tensor-parallel GPT test: sums over
// tokens split over ranks and re-associated, a few ulps per term through 2 layers). The wrong
// positions (contiguous instead of zigzag) or a missing cp reduction move them by >= 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/distributed/collectives.h"
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

CommPtr world() {
  static CommPtr w = distributed::mpi_world();
  return w;
}

CommPtr self_group() {  // a tp group of one
  static CommPtr s = world()->split(world()->rank(), 0, "tp");
  return s;
}

GPTConfig tiny(Arch arch, int cp) {
  GPTConfig c;
  c.arch = arch;
  c.vocab_size = 37;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = arch == Arch::Llama ? cp : 0;
  c.d_model = 32;
  c.seed = 4321;
  return c;
}

void check(Arch arch, CPComm comm, bool ignore = false) {
  const CommPtr cp = world();
  const int n = cp->size(), r = cp->rank();
  const GPTConfig cfg = tiny(arch, n);
  Generator g(77);
  Tensor idx = randint(0, 37, {2, 16}, {DType::Int64}, &g);
  Tensor tgt = randint(0, 37, {2, 16}, {DType::Int64}, &g);
  if (ignore) {
    // Ignored targets near the start only (row 0: all of chunk 0, rank 0's; row 1: the first
    // three positions): the ranks count different numbers of targets.
    std::vector<int64_t> t = to_vector<int64_t>(tgt);
    for (int64_t i = 0; i < 16 / (2 * n); ++i) t[i] = models::kIgnoreIndex;
    for (int64_t i = 16; i < 19; ++i) t[i] = models::kIgnoreIndex;
    tgt = from_vector<int64_t>(t, {2, 16});
  }

  auto one = std::make_shared<GPT>(cfg);
  Tensor want = one->forward(idx, tgt);
  want.backward();

  auto par = std::make_shared<GPT>(cfg);
  ParallelOptions o;
  o.cp_comm = comm;
  apply_parallelism(*par, self_group(), cp, o);
  ASSERT_EQ(par->parallelism()->cp_size(), n);
  Tensor got = par->forward(zigzag_slice(idx, 1, r, n), zigzag_slice(tgt, 1, r, n));
  got.backward();
  const std::string tag = std::string(arch == Arch::GPT2 ? "gpt2" : "llama") +
                          (ignore ? " ignored targets " : " ") + cp_comm_name(comm) +
                          " cp=" + std::to_string(n) + ": ";
  EXPECT_NEAR(got.item<float>(), want.item<float>(), 1e-6 * std::fabs(want.item<float>()))
      << tag << "loss";
  std::map<std::string, Tensor> ref;
  for (auto& [name, p] : one->named_parameters()) ref[name] = p.grad();
  for (auto& [name, p] : par->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << tag << name;
    Tensor avg = distributed::all_reduce_copy(p.grad(), cp, distributed::ReduceOp::Avg);
    const Tensor& w = ref.at(name);
    const std::vector<float> a = to_vector<float>(avg), b = to_vector<float>(w);
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    EXPECT_LE(worst, 1e-5 * max_abs(w)) << tag << name << " grad";
  }
}

TEST(GPTContextParallel, Gpt2RingMatchesOneDevice) {
  check(Arch::GPT2, CPComm::Ring);
}
TEST(GPTContextParallel, Gpt2AllToAllMatchesOneDevice) {
  check(Arch::GPT2, CPComm::AllToAll);
}
TEST(GPTContextParallel, LlamaRingMatchesOneDevice) {
  check(Arch::Llama, CPComm::Ring);
}
TEST(GPTContextParallel, LlamaAllToAllMatchesOneDevice) {
  check(Arch::Llama, CPComm::AllToAll);
}

// Note [Ignored targets under cp] in parallelize.cpp: the loss is the mean over all counted
// targets, not the mean of the ranks' means.
TEST(GPTContextParallel, IgnoredTargetsWeighTheRanks) {
  check(Arch::GPT2, CPComm::Ring, /*ignore=*/true);
  check(Arch::Llama, CPComm::AllToAll, /*ignore=*/true);
}

// Property (Note [Dropout streams] in gpt.cpp): under cp every rank draws its own dropout masks,
// and the model's stream state stays the same on every rank. The embedding stage of a llama
// (dropout 0.5), fed the same token ids on every rank, keeps different elements on rank r > 0
// than on rank 0 (the same masks would keep exactly the same ones: the chance that two
// independent fair masks of 16/cp x 32 elements coincide is at most 2^-128), and after the forward
// every rank's stream is at the same offset (the state a checkpoint saves from cp rank 0 and
// recomputation replays).
TEST(GPTContextParallel, DropoutMasksDifferAcrossRanks) {
  const CommPtr cp = world();
  const int n = cp->size(), r = cp->rank();
  GPTConfig c = tiny(Arch::Llama, n);
  c.dropout = 0.5;
  auto m = std::make_shared<GPT>(c, models::GPTStage{0, 0, true, false});
  apply_parallelism(*m, self_group(), cp, ParallelOptions{});
  m->train();
  const uint64_t before = m->dropout_generator().offset();
  const int64_t local = c.block_size / n;  // this rank's tokens of a full-length sequence
  Tensor h = m->forward_stage(full({1, local}, 3.0, {DType::Int64}));
  ASSERT_EQ(h.numel(), local * c.d_model);
  const uint64_t after = m->dropout_generator().offset();
  EXPECT_GT(after, before);
  Tensor kept = Tensor::empty({n * h.numel()}, DType::Float32);
  Tensor mine = ne(h.detach().reshape({-1}), 0.0).to(DType::Float32);
  cp->all_gather(kept, mine);
  Tensor offsets = Tensor::empty({n}, DType::Float32);
  cp->all_gather(offsets, full({1}, static_cast<double>(after - before)));
  const std::vector<float> all = to_vector<float>(kept), off = to_vector<float>(offsets);
  for (int q = 1; q < n; ++q) {
    EXPECT_FALSE(std::equal(all.begin(), all.begin() + h.numel(), all.begin() + q * h.numel()))
        << "cp ranks 0 and " << q << " drew the same dropout mask (rank " << r << ")";
    EXPECT_EQ(off[static_cast<size_t>(q)], off[0]) << "cp rank " << q << "'s stream advanced "
                                                   << "differently";
  }
}

TEST(GPTContextParallel, BadLayoutsRaise) {
  const CommPtr cp = world();
  GPTConfig c = tiny(Arch::GPT2, cp->size());
  c.n_head = 2 * cp->size() + 1;  // not divisible by cp
  c.d_model = 8 * c.n_head;
  auto m = std::make_shared<GPT>(c);
  ParallelOptions o;
  o.cp_comm = CPComm::AllToAll;
  const std::string e = td::test::error_of([&] { apply_parallelism(*m, self_group(), cp, o); });
  EXPECT_NE(e.find("cp_comm=a2a"), std::string::npos) << e;
  // Generation refuses a cp layout.
  auto g = std::make_shared<GPT>(tiny(Arch::GPT2, cp->size()));
  apply_parallelism(*g, self_group(), cp, ParallelOptions{});
  const std::string e2 = td::test::error_of([&] { g->generate(zeros({1, 2}, {DType::Int64}), 1); });
  EXPECT_NE(e2.find("context parallel"), std::string::npos) << e2;
}

}  // namespace
}  // namespace td::parallel
