#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::test::ThreadCount;

namespace {

// The mask the rule in core/rng.h prescribes, computed element by element.
std::vector<bool> reference_mask(const PhiloxState& st, int64_t n, double p) {
  std::vector<bool> keep(n);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t ctr = st.offset + static_cast<uint64_t>(i / 4);
    auto r = philox4x32(
        {static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32),
         static_cast<uint32_t>(st.subsequence), static_cast<uint32_t>(st.subsequence >> 32)},
        {static_cast<uint32_t>(st.seed), static_cast<uint32_t>(st.seed >> 32)});
    keep[i] = uint_to_uniform(r[i % 4]) >= static_cast<float>(p);
  }
  return keep;
}

// Nonzero inputs, so a zero output means "dropped".
Tensor nonzero_input(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return add(rand(shape, {}, &gen), 0.5);
}

}  // namespace

// The fraction kept is 1-p within 6 binomial standard deviations, sqrt(n p (1-p)) / n.
TEST(Dropout, FractionKeptIsBinomial) {
  const int64_t n = 1 << 20;
  Tensor x = ones({n});
  for (double p : {0.1, 0.5, 0.9}) {
    Generator gen(1234);
    auto y = to_vector<float>(dropout(x, p, true, &gen));
    int64_t kept = 0;
    for (float v : y) kept += v != 0.0f;
    double expect = n * (1 - p), sigma = std::sqrt(n * p * (1 - p));
    EXPECT_LE(std::fabs(kept - expect), 6 * sigma) << "p=" << p << " kept=" << kept;
  }
}

// Kept values are exactly x * float(1/(1-p)); dropped values are exactly 0; the mask is the one
// the Philox rule prescribes, in logical row-major order even for a transposed input; the
// generator advances by ceil(n/4) blocks.
TEST(Dropout, FollowsPhiloxRuleAndScalesExactly) {
  const double p = 0.3;
  Tensor base = nonzero_input({37, 23}, 9);
  Tensor x = base.t();  // non-contiguous, shape [23, 37]
  ASSERT_FALSE(x.is_contiguous());
  Generator gen(42, 5);
  PhiloxState st = Generator(42, 5).reserve(x.numel());
  Tensor y = dropout(x, p, true, &gen);
  EXPECT_EQ(gen.offset(), static_cast<uint64_t>((x.numel() + 3) / 4));
  EXPECT_EQ(y.sizes(), x.sizes());
  auto xs = to_vector<float>(x), ys = to_vector<float>(y);
  auto keep = reference_mask(st, x.numel(), p);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(ys[i], keep[i] ? xs[i] * scale : 0.0f) << "element " << i;
  }
}

// The same (seed, offset) gives the same mask; another seed gives another one.
TEST(Dropout, SameSeedSameMask) {
  Tensor x = nonzero_input({1000}, 1);
  Generator g1(77), g2(77), g3(78);
  Tensor a = dropout(x, 0.5, true, &g1), b = dropout(x, 0.5, true, &g2);
  Tensor c = dropout(x, 0.5, true, &g3);
  EXPECT_EQ(to_vector<float>(a), to_vector<float>(b));
  EXPECT_NE(to_vector<float>(a), to_vector<float>(c));
  // The second draw from one generator uses fresh numbers.
  Tensor a2 = dropout(x, 0.5, true, &g1);
  EXPECT_NE(to_vector<float>(a), to_vector<float>(a2));
  // The default generator, reseeded, repeats itself.
  manual_seed(99);
  Tensor d1 = dropout(x, 0.5);
  manual_seed(99);
  Tensor d2 = dropout(x, 0.5);
  EXPECT_EQ(to_vector<float>(d1), to_vector<float>(d2));
}

// The mask does not depend on the number of threads (large enough for the parallel path).
TEST(Dropout, IndependentOfThreadCount) {
  Tensor x = nonzero_input({1 << 18}, 2);
  std::vector<float> one, two;
  {
    ThreadCount tc(1);
    Generator g(5);
    one = to_vector<float>(dropout(x, 0.25, true, &g));
  }
  {
    ThreadCount tc(2);
    Generator g(5);
    two = to_vector<float>(dropout(x, 0.25, true, &g));
  }
  EXPECT_EQ(one, two);
}

// The backward regenerates the forward's mask: dx = g * mask / (1-p) with the same zeros.
TEST(Dropout, BackwardUsesSameMask) {
  const double p = 0.4;
  Tensor x = nonzero_input({64, 33}, 3).set_requires_grad(true);
  Generator gen(8);
  Tensor y = dropout(x, p, true, &gen);
  Generator gg(9);
  Tensor g = randn(x.sizes(), {}, &gg);
  y.backward(g);
  auto ys = to_vector<float>(y), gs = to_vector<float>(g), dx = to_vector<float>(x.grad());
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  int64_t kept = 0;
  for (size_t i = 0; i < ys.size(); ++i) {
    bool k = ys[i] != 0.0f;
    kept += k;
    ASSERT_EQ(dx[i], k ? gs[i] * scale : 0.0f) << "element " << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, static_cast<int64_t>(ys.size()));
}

// With a fixed stream per call the op is a linear map, and autograd agrees with finite
// differences (also through a transposed input).
TEST(Dropout, Gradcheck) {
  Tensor x = nonzero_input({6, 5}, 4).t().set_requires_grad(true);
  auto r = autograd::gradcheck(
      [](const TensorList& in) {
        Generator g(21);
        return dropout(in[0], 0.5, true, &g);
      },
      {x});
  EXPECT_TRUE(r.ok) << r.message;
}

// bf16: the kept value is the fp32 product rounded once.
TEST(Dropout, Bf16) {
  Tensor xf = nonzero_input({513}, 6).to(DType::BFloat16).to(DType::Float32);
  Tensor xb = xf.to(DType::BFloat16);
  Generator g1(3), g2(3);
  Tensor yb = dropout(xb, 0.2, true, &g1);
  Tensor yf = dropout(xf, 0.2, true, &g2);
  EXPECT_EQ(yb.dtype(), DType::BFloat16);
  EXPECT_EQ(to_vector<float>(yb), to_vector<float>(yf.to(DType::BFloat16)));
}

// p == 0 or eval mode: the input itself; p == 1: zeros with zero gradient.
TEST(Dropout, EdgeProbabilities) {
  Tensor x = nonzero_input({10}, 5).set_requires_grad(true);
  EXPECT_TRUE(dropout(x, 0.0).is_same(x));
  EXPECT_TRUE(dropout(x, 0.7, false).is_same(x));
  Tensor y = dropout(x, 1.0);
  EXPECT_EQ(to_vector<float>(y), std::vector<float>(10, 0.0f));
  sum(y).backward();
  EXPECT_EQ(to_vector<float>(x.grad()), std::vector<float>(10, 0.0f));
  Tensor e = dropout(zeros({0, 3}), 0.5);
  EXPECT_EQ(e.sizes(), (Shape{0, 3}));
}

TEST(Dropout, BadInputIsAnError) {
  Tensor x = ones({4});
  EXPECT_THROW(dropout(x, -0.1), Error);
  EXPECT_THROW(dropout(x, 1.5), Error);
  EXPECT_THROW(dropout(x, 1.5, false), Error);
  EXPECT_THROW(dropout(arange(0, 4), 0.5), Error);
  EXPECT_THROW(dropout_apply(x, 2.0, PhiloxState{}), Error);
}
