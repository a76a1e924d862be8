// clip_grad_norm_ against torch's rule in double.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "tardelli/optim/clip_grad.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::test::doubles;

namespace {

// Parameters with gradients: a large fp32 one (several chunks), a bf16 one, a non-contiguous
// gradient, and a parameter without a gradient.
TensorList make_params(uint64_t seed, double scale) {
  Generator gen(seed);
  TensorList ps;
  Tensor a = zeros({50000}), b = zeros({7, 9}, {DType::BFloat16}), c = zeros({6, 4}),
         d = zeros({3});
  for (Tensor* t : {&a, &b, &c, &d}) t->set_requires_grad(true);
  a.set_grad(mul(randn({50000}, {}, &gen), scale));
  b.set_grad(mul(randn({7, 9}, {}, &gen), scale).to(DType::BFloat16));
  c.set_grad(mul(randn({4, 6}, {}, &gen), scale).t());  // non-contiguous gradient
  return {a, b, c, d};
}

double ref_norm(const TensorList& ps, double p) {
  double acc = 0;
  for (const auto& t : ps) {
    if (!t.grad().defined()) continue;
    for (double g : doubles(t.grad())) {
      acc = std::isinf(p) ? std::max(acc, std::fabs(g)) : acc + std::pow(std::fabs(g), p);
    }
  }
  return std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
}

}  // namespace

// The 2-norm over all gradients (double accumulation: 1e-12 relative) is returned and, above
// max_norm, every gradient is scaled by max_norm / (total + 1e-6) (fp32 multiply, bf16 storage
// for the bf16 gradient: one bf16 ulp); afterwards the norm is max_norm to that precision.
TEST(OptimClipGrad, TwoNormClips) {
  TensorList ps = make_params(1, 1.0);
  std::vector<std::vector<double>> before;
  for (auto& t : ps)
    before.push_back(t.grad().defined() ? doubles(t.grad()) : std::vector<double>{});
  const double want = ref_norm(ps, 2.0);
  const double got = optim::clip_grad_norm_(ps, 1.0);
  EXPECT_NEAR(got, want, 1e-12 * want);
  const double coef = 1.0 / (want + 1e-6);
  for (size_t k = 0; k < 3; ++k) {
    std::vector<double> g = doubles(ps[k].grad());
    const double rtol = k == 1 ? std::ldexp(1.0, -8) : 1e-6;
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], before[k][i] * coef, rtol * std::fabs(before[k][i] * coef) + 1e-12)
          << k << " " << i;
  }
  EXPECT_FALSE(ps[3].grad().defined());
  EXPECT_NEAR(optim::grad_norm(ps), 1.0, 1e-3);
}

// Below max_norm nothing changes (bitwise), and the norm is still returned.
TEST(OptimClipGrad, NoClipBelowMax) {
  TensorList ps = make_params(2, 1e-3);
  std::vector<float> before = to_vector<float>(ps[0].grad());
  const double want = ref_norm(ps, 2.0);
  EXPECT_NEAR(optim::clip_grad_norm_(ps, 10.0), want, 1e-12 * want);
  EXPECT_EQ(to_vector<float>(ps[0].grad()), before);
}

// 1-norm, inf-norm and a general p against the reference; clipping with them too.
TEST(OptimClipGrad, OtherNorms) {
  for (double p : {1.0, 3.0, optim::kInfNorm}) {
    TensorList ps = make_params(3, 1.0);
    const double want = ref_norm(ps, p);
    EXPECT_NEAR(optim::grad_norm(ps, p), want, 1e-12 * want) << p;
    EXPECT_NEAR(optim::clip_grad_norm_(ps, 0.5, p), want, 1e-12 * want) << p;
    EXPECT_NEAR(ref_norm(ps, p), 0.5, 1e-3) << p;
  }
}

// The result does not depend on the number of threads (fixed chunking, in-order combination).
TEST(OptimClipGrad, ThreadCountIndependent) {
  TensorList ps = make_params(4, 1.0);
  const int prev = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = optim::grad_norm(ps);
  omp_set_num_threads(2);
  const double two = optim::grad_norm(ps);
  omp_set_num_threads(prev);
  EXPECT_EQ(one, two);
}

// Edge cases: no gradients -> 0; a tensor listed twice counts (and is scaled) once; a
// non-finite norm is returned without touching the gradients, or raises on request; bad
// max_norm / norm_type are errors.
TEST(OptimClipGrad, EdgeCases) {
  Tensor p = zeros({3});
  p.set_requires_grad(true);
  EXPECT_EQ(optim::clip_grad_norm_({p}, 1.0), 0.0);
  EXPECT_EQ(optim::clip_grad_norm_({}, 1.0), 0.0);
  p.set_grad(from_vector<float>({3.0f, 4.0f, 0.0f}, {3}));
  EXPECT_NEAR(optim::clip_grad_norm_({p, p}, 1.0), 5.0, 1e-12);
  EXPECT_NEAR(doubles(p.grad())[0], 3.0 / (5.0 + 1e-6), 1e-6);
  p.set_grad(from_vector<float>({INFINITY, 1.0f, 0.0f}, {3}));
  EXPECT_TRUE(std::isinf(optim::clip_grad_norm_({p}, 1.0)));
  EXPECT_EQ(doubles(p.grad())[1], 1.0);
  EXPECT_THROW(optim::clip_grad_norm_({p}, 1.0, 2.0, true), Error);
  EXPECT_THROW(optim::clip_grad_norm_({p}, -1.0), Error);
  EXPECT_THROW(optim::clip_grad_norm_({p}, 1.0, 0.0), Error);
}
