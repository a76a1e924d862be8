#include <gtest/gtest.h>

#include <cmath>

#include "tardelli/tardelli.h"

using namespace td;

namespace {

double max_rel(const Tensor& a, const Tensor& b) {
  auto av = to_vector<float>(a), bv = to_vector<float>(b);
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < av.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(av[i]) - bv[i]));
    den = std::max(den, std::fabs(static_cast<double>(bv[i])));
  }
  return num / den;
}

}  // namespace

// The chunked fused head equals the unfused linear + cross_entropy in loss and both gradients,
// for chunkings that split the rows unevenly and with ignored rows. fp32 sums of O(100) terms:
// agreement to 1e-5 relative (normwise) is rounding-level.
TEST(LinearCrossEntropy, MatchesUnfused) {
  Generator gen(5);
  const int64_t N = 37, d = 16, V = 50;
  Tensor x0 = randn({N, d}, {}, &gen), w0 = mul(randn({V, d}, {}, &gen), 0.3);
  Tensor t = randint(0, V, {N}, {DType::Int64}, &gen);
  t.narrow(0, 3, 4).fill_(-100);
  // 0: the chunk size chosen by device (Note [LM head chunk size]).
  for (int64_t chunk : {int64_t{0}, int64_t{1} << 22, V * 8, V * 5 + 7, int64_t{1}}) {
    Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
    Tensor xr = x0.clone().set_requires_grad(true), wr = w0.clone().set_requires_grad(true);
    Tensor loss = linear_cross_entropy(x, w, t, -100, chunk);
    Tensor ref = cross_entropy(linear(xr, wr), t, -100, Reduction::Mean);
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * std::fabs(ref.item<double>()));
    mul(loss, 2.5).backward();
    mul(ref, 2.5).backward();
    EXPECT_LT(max_rel(x.grad(), xr.grad()), 1e-5) << chunk;
    EXPECT_LT(max_rel(w.grad(), wr.grad()), 1e-5) << chunk;
  }
  EXPECT_THROW(linear_cross_entropy(x0, w0, t, -100, -1), Error);
}

// bf16 inputs: the gradient w.r.t. bf16 weights is accumulated in fp32 and rounded once, so it
// stays within bf16 rounding (~1e-2) of the fp32 computation on the same rounded inputs.
TEST(LinearCrossEntropy, Bf16) {
  Generator gen(6);
  Tensor x = randn({24, 8}, {}, &gen).to(DType::BFloat16).set_requires_grad(true);
  Tensor w = randn({30, 8}, {}, &gen).to(DType::BFloat16).set_requires_grad(true);
  Tensor t = randint(0, 30, {24}, {DType::Int64}, &gen);
  Tensor loss = linear_cross_entropy(x, w, t, -100, 30 * 5);
  loss.backward();
  Tensor xf = x.detach().to(DType::Float32).set_requires_grad(true);
  Tensor wf = w.detach().to(DType::Float32).set_requires_grad(true);
  Tensor ref = cross_entropy(linear(xf, wf), t);
  ref.backward();
  EXPECT_EQ(loss.dtype(), DType::Float32);
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-2 * ref.item<double>());
  EXPECT_EQ(w.grad().dtype(), DType::BFloat16);
  EXPECT_LT(max_rel(w.grad().to(DType::Float32), wf.grad()), 2e-2);
  EXPECT_LT(max_rel(x.grad().to(DType::Float32), xf.grad()), 2e-2);
}

// The whole [N, V] logits never exist: peak memory of loss+backward stays well below one
// logits matrix (N*V fp32 = 32 MiB here; chunks are 1 MiB).
TEST(LinearCrossEntropy, NeverHoldsFullLogits) {
  const int64_t N = 1024, d = 32, V = 8192;
  Tensor x = randn({N, d}).set_requires_grad(true), w = randn({V, d}).set_requires_grad(true);
  Tensor t = randint(0, V, {N});
  empty_cache();
  reset_peak_memory_stats();
  int64_t base = memory_stats().current_bytes;
  linear_cross_entropy(x, w, t, -100, int64_t{1} << 18).backward();
  int64_t peak = memory_stats().peak_bytes - base;
  EXPECT_LT(peak, N * V * 4 / 4) << peak;
}

TEST(LinearCrossEntropy, EdgeCasesAndErrors) {
  Tensor x = randn({4, 3}), w = randn({5, 3});
  Tensor all_ignored = full({4}, -100, {DType::Int64});
  EXPECT_TRUE(std::isnan(linear_cross_entropy(x, w, all_ignored).item<float>()));
  EXPECT_THROW(linear_cross_entropy(x, randn({5, 2}), zeros({4}, {DType::Int64})), Error);
  EXPECT_THROW(linear_cross_entropy(x, w, zeros({3}, {DType::Int64})), Error);
  EXPECT_THROW(linear_cross_entropy(x, w, zeros({4})), Error);
  EXPECT_THROW(linear_cross_entropy(x, w, full({4}, 7, {DType::Int64})), Error);
}

// The forward computes the gradients eagerly and backward scales copies of them (Note [Chunked
// LM head]): a retained graph run twice must accumulate exactly twice the single-run gradients,
// and gradients flow only to the inputs that require them.
TEST(LinearCrossEntropy, RetainedGraphAndPartialGrads) {
  Generator gen(7);
  Tensor x0 = randn({20, 6}, {}, &gen), w0 = randn({11, 6}, {}, &gen);
  Tensor t = randint(0, 11, {20}, {DType::Int64}, &gen);
  Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  Tensor loss = linear_cross_entropy(x, w, t, -100, 11 * 3);
  loss.backward(Tensor(), /*retain_graph=*/true);
  std::vector<float> gx1 = to_vector<float>(x.grad()), gw1 = to_vector<float>(w.grad());
  loss.backward();
  std::vector<float> gx2 = to_vector<float>(x.grad()), gw2 = to_vector<float>(w.grad());
  for (size_t i = 0; i < gx1.size(); ++i) EXPECT_EQ(gx2[i], 2.0f * gx1[i]) << i;  // x2 is exact
  for (size_t i = 0; i < gw1.size(); ++i) EXPECT_EQ(gw2[i], 2.0f * gw1[i]) << i;

  Tensor xo = x0.clone().set_requires_grad(true);
  linear_cross_entropy(xo, w0, t).backward();  // the weight is a constant
  EXPECT_LT(max_rel(mul(xo.grad(), 2.0), x.grad()), 1e-6);
  Tensor wo = w0.clone().set_requires_grad(true);
  linear_cross_entropy(x0, wo, t).backward();  // the input is a constant
  EXPECT_LT(max_rel(mul(wo.grad(), 2.0), w.grad()), 1e-6);
  {
    autograd::NoGradGuard ng;
    EXPECT_FALSE(linear_cross_entropy(x, w, t).requires_grad());
  }
  // Every row ignored: the loss is NaN (0/0, as cross_entropy) and the gradients are zero.
  Tensor xi = x0.clone().set_requires_grad(true);
  linear_cross_entropy(xi, w0, full({20}, -100, {DType::Int64})).backward();
  EXPECT_EQ(sum(abs(xi.grad())).item<float>(), 0.0f);
}
