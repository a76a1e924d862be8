// Compressed gradient reductions with error feedback (distributed/grad_compression.h) at 2 and 4
// ranks.
//
// Inputs are integers times 1/8 of magnitude <= 16, so sums of a few of them are exact in fp32:
// top-k exchanges and the error-feedback bookkeeping are checked bitwise; PowerSGD goes through
// GEMMs and a Gram-Schmidt, so its full-rank mean is checked to 1e-5 of the largest magnitude
// (fp32 rounding of sums of ~10 products), and its bookkeeping to the same.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data_parallel_test_util.h"
#include "tardelli/distributed/data_parallel.h"
#include "tardelli/distributed/grad_compression.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/reduction.h"
#include "test_util.h"

namespace td::distributed {
namespace {

using td::test::error_of;
using td::test::same_bytes;

CommPtr world() {
  static CommPtr w = mpi_world();
  return w;
}

// A bucket of two matrices and a vector: [4, 6], [6, 4], [5] (offsets 0, 24, 48).
std::vector<CompressedParam> layout() {
  return {{"a", {4, 6}, 0, 24}, {"b", {6, 4}, 24, 24}, {"c", {5}, 48, 5}};
}
constexpr int64_t kN = 53;

Tensor grad(int rank, uint64_t step) {
  Generator g(1000 * step + static_cast<uint64_t>(rank));
  return mul(randint(-128, 128, {kN}, {DType::Int64, kCPU, false}, &g).to(DType::Float32), 0.125);
}

// Every rank's tensor [P, n] (an all-gather).
Tensor gather(const Tensor& t, const CommPtr& c) {
  Tensor out = Tensor::empty({c->size() * t.numel()}, t.dtype(), kCPU);
  c->all_gather(out, t.contiguous());
  return out.view({c->size(), t.numel()});
}

double max_abs(const Tensor& t) {
  return max(abs(t)).item<double>();
}

// Property: top-k at ratio 1 sends everything: the mean equals the exact mean bitwise, and
// nothing is left in the residual.
TEST(GradCompression, TopKAtRatioOneIsTheExactMean) {
  const CommPtr w = world();
  auto c = topk_compressor(1.0);
  Tensor g = grad(w->rank(), 1), want = g.clone();
  w->all_reduce(want, ReduceOp::Avg);
  Tensor buf = g.clone();
  c->reduce(0, buf, layout(), w, true);
  EXPECT_TRUE(same_bytes(buf, want));
  for (const auto& [k, v] : c->state()) {
    if (k != "topk.calls") {
      EXPECT_EQ(max_abs(v), 0.0) << k;
    }
  }
}

// Property (Note [Error feedback]): over two steps of top-k at ratio 1/4, what was applied (the
// means, times P) plus every rank's final residual equals the sum of every rank's gradients,
// bitwise; each step sends 2 k elements per rank (k = ceil(n / 4)).
TEST(GradCompression, TopKErrorFeedbackBookkeepingIsExact) {
  const CommPtr w = world();
  const int P = w->size();
  auto c = topk_compressor(0.25);
  Tensor applied = zeros({kN}), all_g = zeros({kN});
  for (uint64_t step = 1; step <= 2; ++step) {
    Tensor buf = grad(w->rank(), step);
    c->reduce(0, buf, layout(), w, /*average=*/false);  // sum: no rounding of a 1/P
    applied = add(applied, buf);
    all_g = add(all_g, sum(gather(grad(w->rank(), step), w), {0}));
  }
  Tensor resid = zeros({kN});
  for (const auto& p : layout()) {
    Tensor e = c->state().at(p.name + ".topk_error");
    resid.narrow(0, p.offset, p.numel).copy_(e);
  }
  Tensor lhs = add(applied, sum(gather(resid, w), {0}));
  EXPECT_TRUE(same_bytes(lhs, all_g));
  const int64_t k = (kN + 3) / 4;
  EXPECT_EQ(c->elements_sent(), 2 * 2 * k);
  EXPECT_EQ(c->elements_dense(), 2 * kN);
  EXPECT_EQ(P, w->size());
}

// Property (Note [PowerSGD]): at rank = min(rows, cols) = 4 the approximation spans every
// column space: the mean equals the exact mean to fp32 rounding; the residuals (D_i - D') sum to
// zero over ranks; the vector travels uncompressed.
TEST(GradCompression, PowerSGDAtFullRankIsTheExactMean) {
  const CommPtr w = world();
  auto c = powersgd_compressor(4, /*seed=*/7);
  for (uint64_t step = 1; step <= 2; ++step) {
    Tensor g = grad(w->rank(), step), want = g.clone();
    w->all_reduce(want, ReduceOp::Avg);
    Tensor buf = g.clone();
    c->reduce(0, buf, layout(), w, true);
    const double tol = 1e-5 * max_abs(want);
    EXPECT_LE(max_abs(sub(buf, want)), tol) << "step " << step;
    EXPECT_TRUE(same_bytes(buf.narrow(0, 48, 5), want.narrow(0, 48, 5)));
    for (const char* n : {"a", "b"}) {
      Tensor e = c->state().at(std::string(n) + ".powersgd_error");
      EXPECT_LE(max_abs(sum(gather(e, w), {0})), 8 * tol) << n << " step " << step;
    }
  }
  // Each step: P = [4,4] + [6,4], Q = [6,4] + [4,4] (40 + 40) and the 5-vector.
  EXPECT_EQ(c->elements_sent(), 2 * (40 + 40 + 5));
}

// Property: at rank 1 the bookkeeping still holds: sum_i e_i + P x D' = sum_i D_i (D_i = g_i on
// the first step), to fp32 rounding; and the applied mean differs from the exact one (it is a
// rank-1 approximation), which error feedback then carries.
TEST(GradCompression, PowerSGDLowRankBookkeeping) {
  const CommPtr w = world();
  const int P = w->size();
  auto c = powersgd_compressor(1, 3);
  Tensor g = grad(w->rank(), 5), buf = g.clone();
  c->reduce(0, buf, layout(), w, true);
  Tensor exact = g.clone();
  w->all_reduce(exact, ReduceOp::Avg);
  for (const auto& p : layout()) {
    if (p.shape.size() < 2) continue;
    Tensor e = c->state().at(p.name + ".powersgd_error");
    Tensor lhs = add(sum(gather(e, w), {0}), mul(buf.narrow(0, p.offset, p.numel), P));
    Tensor rhs = sum(gather(g.narrow(0, p.offset, p.numel).contiguous(), w), {0});
    EXPECT_LE(max_abs(sub(lhs, rhs)), 1e-5 * P * max_abs(rhs)) << p.name;
    EXPECT_GT(max_abs(sub(buf.narrow(0, p.offset, p.numel), exact.narrow(0, p.offset, p.numel))),
              1e-3)
        << p.name << ": a rank-1 approximation of a random matrix is not exact";
  }
}

// Property (Note [Compression warm-up]): an inactive compressor is the plain mean, bitwise (the
// same all-reduce as an uncompressed DDP), sends the dense count and leaves its error feedback
// alone: switched on afterwards, it starts from the residual a fresh compressor has (zero), so
// its first compressed step equals a fresh compressor's bitwise.
TEST(GradCompression, InactiveCompressorIsThePlainMean) {
  const CommPtr w = world();
  for (const char* kind : {"powersgd", "topk"}) {
    const auto make = [&] {
      return std::string(kind) == "powersgd" ? powersgd_compressor(2, 5) : topk_compressor(0.25);
    };
    auto c = make(), fresh = make();
    c->set_active(false);
    Tensor g = grad(w->rank(), 1), want = g.clone(), buf = g.clone();
    w->all_reduce(want, ReduceOp::Avg);
    c->reduce(0, buf, layout(), w, true);
    EXPECT_TRUE(same_bytes(buf, want)) << kind;
    EXPECT_EQ(c->elements_sent(), kN) << kind;
    EXPECT_EQ(c->elements_dense(), kN) << kind;
    c->set_active(true);
    Tensor a = grad(w->rank(), 2), b = a.clone();
    c->reduce(0, a, layout(), w, true);
    fresh->reduce(0, b, layout(), w, true);
    EXPECT_TRUE(same_bytes(a, b)) << kind;
  }
}

// Property: a DDP whose buckets go through top-k at ratio 1 gives the flat DDP's averaged
// gradients (all_reduce and ZeRO-1 shards), to fp32 rounding of the reordered sums.
TEST(GradCompression, DataParallelWithCompressorEqualsFlat) {
  const CommPtr w = world();
  for (bool zero : {false, true}) {
    DDPOptions o{8192, true, zero, true};
    o.compressor = topk_compressor(1.0);
    dp_test::expect_same_grads_as_flat(w, w, o, zero, 4);
  }
}

TEST(GradCompression, BadArgumentsAreErrors) {
  const CommPtr w = world();
  EXPECT_NE(error_of([] { topk_compressor(0.0); }).find("ratio must be in (0, 1], got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { topk_compressor(1.5, true); }).find("random-k"), std::string::npos);
  EXPECT_NE(error_of([] { powersgd_compressor(0); }).find("rank must be >= 1"), std::string::npos);
  auto c = powersgd_compressor(5);
  Tensor buf = grad(w->rank(), 1);
  const std::string e = error_of([&] { c->reduce(0, buf, layout(), w, true); });
  EXPECT_NE(e.find("rank 5 exceeds a dimension of parameter 'a' [4, 6]"), std::string::npos) << e;
  Tensor p = zeros({4});
  p.set_requires_grad(true);
  DDPOptions o{4096, true, true, true};
  o.shard_grads = true;
  o.compressor = topk_compressor(0.5);
  EXPECT_NE(error_of([&] {
              DistributedDataParallel d({{"p", p}}, w, o);
            }).find("not with ZeRO-2/3"),
            std::string::npos);
}

}  // namespace
}  // namespace td::distributed
