// cross_entropy (and linear_cross_entropy) on CUDA against the CPU backend: losses for every
// reduction, label smoothing, ignore_index, gradients through autograd, vocabulary-sized rows,
// int32 targets, non-contiguous logits, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tardelli/autograd/engine.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Mean ? "mean" : "sum";
}

// Targets in [0, C) with every `ignore_every`-th row set to ignore_index (0: none ignored).
Tensor targets(int64_t rows, int64_t C, uint64_t seed, int64_t ignore_every, int64_t ignore_index) {
  Generator gen(seed);
  Tensor t = randint(0, C, {rows}, {DType::Int64, kCPU, false}, &gen);
  std::vector<int64_t> v = to_vector<int64_t>(t);
  if (ignore_every > 0) {
    for (size_t i = 0; i < v.size(); i += static_cast<size_t>(ignore_every)) v[i] = ignore_index;
  }
  return from_vector<int64_t>(v, {rows});
}

// cross_entropy of logits (CPU, any layout) and target on both backends: loss and dlogits.
void check_ce(const Tensor& logits_cpu, const Tensor& target_cpu, int64_t ignore_index,
              Reduction red, double smoothing, uint64_t seed, const std::string& what_in) {
  const DType dt = logits_cpu.dtype();
  const std::string what = std::string("cross_entropy ") + name(dt) + " " +
                           shape_str(logits_cpu.sizes()) + " " + reduction_name(red) +
                           " smoothing " + std::to_string(smoothing) + " " + what_in;
  Tensor lc = cpu_leaf(logits_cpu), lg = gpu_leaf(logits_cpu);
  Tensor tg = target_cpu.to(gpu());
  Tensor yc = cross_entropy(lc, target_cpu, ignore_index, red, smoothing);
  Tensor yg = cross_entropy(lg, tg, ignore_index, red, smoothing);
  // The loss is a sum of fp32 row losses (accumulated in double on both backends); the per-row
  // logsumexp sums C terms in different orders: 1e-5 relative for fp32.
  expect_matches(yg, yc, tol(dt), what + " loss");
  Tensor g = red == Reduction::None ? randn_seeded(yc.sizes(), seed, dt)
                                    : full({}, 0.75, {dt, kCPU, false});
  Tensor dc = autograd::grad({yc}, {lc}, {g})[0];
  Tensor dg = autograd::grad({yg}, {lg}, {g.to(gpu())})[0];
  expect_matches(dg, dc, tol(dt), what + " dlogits");
}

TEST(CrossEntropyCuda, MatchesCpuOnAwkwardSizes) {
  TD_REQUIRE_CUDA();
  uint64_t seed = 2000;
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (int64_t C : {1, 7, 1000, 4096, 8195, 50257}) {
      const int64_t rows = C >= 8195 ? 6 : 41;
      ++seed;
      Tensor logits = randn_seeded({rows, C}, seed, 2.0).to(dt);
      Tensor t = targets(rows, C, seed, 4, -100);
      for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
        check_ce(logits, t, -100, red, 0.0, seed + 1, "");
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CrossEntropyCuda, LabelSmoothingAndIgnoreIndex) {
  TD_REQUIRE_CUDA();
  Tensor logits = randn_seeded({64, 50257}, 3, 3.0);
  Tensor t = targets(64, 50257, 4, 3, 7);  // ignore_index 7 is also a valid class
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    check_ce(logits, t, 7, red, 0.1, 5, "vocab");
    check_ce(logits, t, 7, red, 1.0, 6, "vocab");
  }
  check_ce(randn_seeded({300, 1000}, 7).to(DType::BFloat16), targets(300, 1000, 8, 5, -1), -1,
           Reduction::Mean, 0.2, 9, "bf16");
}

TEST(CrossEntropyCuda, ManyRowsBatchedInt32AndNonContiguous) {
  TD_REQUIRE_CUDA();
  check_ce(randn_seeded({5000, 37}, 10), targets(5000, 37, 11, 9, -100), -100, Reduction::Mean, 0.0,
           12, "many rows");
  // [2, 3, C] logits with [2, 3] int32 targets.
  Tensor t32 = targets(6, 100, 13, 4, -100).to(DType::Int32).view({2, 3});
  check_ce(randn_seeded({2, 3, 100}, 14), t32, -100, Reduction::Mean, 0.0, 15, "int32 batched");
  check_ce(randn_seeded({2, 3, 100}, 16), t32, -100, Reduction::None, 0.0, 17, "int32 none");
  // Transposed (strided) logits.
  Tensor lt = transpose(randn_seeded({500, 20}, 18), 0, 1);
  ASSERT_FALSE(lt.is_contiguous());
  check_ce(lt, targets(20, 500, 19, 0, -100), -100, Reduction::Sum, 0.0, 20, "transposed");
  // 1-d logits [C] with a 0-dim target.
  check_ce(randn_seeded({333}, 21), from_vector<int64_t>({5}, {}), -100, Reduction::Mean, 0.0, 22,
           "1-d");
}

TEST(CrossEntropyCuda, LargeLogitsStayAccurate) {
  TD_REQUIRE_CUDA();
  check_ce(randn_seeded({8, 4096}, 23, 1.0, 1000.0), targets(8, 4096, 24, 0, -100), -100,
           Reduction::None, 0.0, 25, "offset 1000");
}

TEST(CrossEntropyCuda, AllIgnoredMeanIsNaNWithZeroGradient) {
  TD_REQUIRE_CUDA();
  Tensor lg = gpu_leaf(randn_seeded({4, 10}, 26));
  Tensor t = full({4}, -100, {DType::Int64, gpu(), false});
  Tensor y = cross_entropy(lg, t);
  EXPECT_TRUE(std::isnan(y.item_double()));
  Tensor d = autograd::grad({y}, {lg}, {full({}, 1.0, {DType::Float32, gpu(), false})})[0];
  for (double v : doubles(d)) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(cross_entropy(lg.detach(), t, -100, Reduction::Sum).item_double(), 0.0);
}

TEST(CrossEntropyCuda, EmptyBatch) {
  TD_REQUIRE_CUDA();
  Tensor l = zeros({0, 10}, {DType::Float32, gpu()});
  Tensor t = zeros({0}, {DType::Int64, gpu()});
  EXPECT_EQ(cross_entropy(l, t, -100, Reduction::Sum).item_double(), 0.0);
  EXPECT_EQ(cross_entropy(l, t, -100, Reduction::None).sizes(), (Shape{0}));
}

TEST(CrossEntropyCuda, BadInputsRaise) {
  TD_REQUIRE_CUDA();
  Tensor l = randn_seeded({3, 10}, 27).to(gpu());
  const std::string msg = error_of([&] {
    cross_entropy(l, from_vector<int64_t>({1, 10, 2}, {3}).to(gpu()));
  });
  EXPECT_NE(msg.find("target 10 at position 1 is out of range for 10 classes"), std::string::npos)
      << msg;
  EXPECT_THROW(cross_entropy(l, from_vector<int64_t>({1, -3, 2}, {3}).to(gpu())), Error);
  EXPECT_THROW(cross_entropy(l, from_vector<int64_t>({1, 2, 3}, {3})), Error);  // CPU target
  EXPECT_THROW(cross_entropy(l, from_vector<int64_t>({1, 2}, {2}).to(gpu())), Error);
  EXPECT_THROW(cross_entropy(l, zeros({3}, {DType::Float32, gpu()})), Error);
  EXPECT_THROW(
      cross_entropy(l, from_vector<int64_t>({1, 2, 3}, {3}).to(gpu()), -100, Reduction::Mean, 1.5),
      Error);
}

TEST(LinearCrossEntropyCuda, MatchesCpuAcrossChunks) {
  TD_REQUIRE_CUDA();
  const int64_t N = 37, d = 64, V = 1000;
  Tensor x = randn_seeded({N, d}, 28, 0.5), w = randn_seeded({V, d}, 29, 0.1);
  Tensor t = targets(N, V, 30, 6, -100);
  for (int64_t chunk : {int64_t{5000}, int64_t{1} << 22}) {  // 5 rows per chunk, then one chunk
    Tensor xc = cpu_leaf(x), wc = cpu_leaf(w), xg = gpu_leaf(x), wg = gpu_leaf(w);
    Tensor yc = linear_cross_entropy(xc, wc, t, -100, chunk);
    Tensor yg = linear_cross_entropy(xg, wg, t.to(gpu()), -100, chunk);
    const std::string what = "linear_cross_entropy chunk " + std::to_string(chunk);
    // The logits come from a GEMM whose summation order differs from the CPU's: 1e-4.
    expect_matches(yg, yc, 1e-4, what + " loss");
    Tensor g = full({}, 1.5);
    TensorList gc = autograd::grad({yc}, {xc, wc}, {g});
    TensorList gg = autograd::grad({yg}, {xg, wg}, {g.to(gpu())});
    expect_matches(gg[0], gc[0], 1e-4, what + " dx");
    expect_matches(gg[1], gc[1], 1e-4, what + " dweight");
  }
  EXPECT_THROW(linear_cross_entropy(x.to(gpu()), w, t.to(gpu())), Error);  // weight on the CPU
}

// Note [Head without read-backs]: on a GPU the head reads nothing back; a bad target is reported
// by the deferred check at the next read to the host (here the loss's), naming the op, the
// target and its position; every row ignored gives a NaN loss and zero gradients, as on the CPU.
TEST(LinearCrossEntropyCuda, BadTargetsAreReportedAtTheNextReadAndAllIgnoredIsNan) {
  TD_REQUIRE_CUDA();
  Tensor x = randn_seeded({6, 16}, 31, 0.5).to(gpu()),
         w = randn_seeded({50, 16}, 32, 0.1).to(gpu());
  Tensor bad = from_vector<int64_t>({1, 2, 50, 3, 4, 5}, {6}).to(gpu());
  Tensor xg = gpu_leaf(x.to(kCPU));
  Tensor y;
  ASSERT_NO_THROW(y = linear_cross_entropy(xg, w, bad));  // nothing read back yet
  const std::string msg = error_of([&] { y.item_double(); });
  EXPECT_NE(msg.find("target 50 at position 2 is out of range for 50 classes"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("deferred device check"), std::string::npos) << msg;
  // The check ran and is gone: a good call reads back normally.
  Tensor good = from_vector<int64_t>({1, 2, 3, 3, 4, 5}, {6}).to(gpu());
  EXPECT_TRUE(std::isfinite(linear_cross_entropy(x, w, good).item_double()));
  Tensor ignored = full({6}, -100.0, {DType::Int64, gpu()});
  Tensor xi = gpu_leaf(x.to(kCPU));
  Tensor yi = linear_cross_entropy(xi, w, ignored);
  EXPECT_TRUE(std::isnan(yi.item_double()));
  yi.backward();
  EXPECT_EQ(max(abs(xi.grad())).item_double(), 0.0);
}

}  // namespace
