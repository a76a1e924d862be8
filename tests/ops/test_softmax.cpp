#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// Softmax (or log_softmax) of a row-major [outer, n, inner] array along the middle dim, in
// double: the reference for any dim of any tensor (outer/inner are the products around it).
std::vector<double> ref_softmax(const std::vector<double>& x, const Shape& shape, int64_t dim,
                                bool log) {
  int64_t n = shape[dim], outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= shape[i];
  for (size_t i = dim + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t in = 0; in < inner; ++in) {
      auto at = [&](int64_t j) { return (o * n + j) * inner + in; };
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, x[at(j)]);
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j) {
        y[at(j)] = log ? x[at(j)] - m - std::log(s) : std::exp(x[at(j)] - m) / s;
      }
    }
  }
  return y;
}

}  // namespace

// softmax/log_softmax over the last dim match the double reference. fp32 rounding of the
// inputs to exp and of the sum gives errors of a few ulp: 1e-6 relative (+1e-7 absolute for
// the tiny probabilities) is ~10 ulp. Rows of 37 and 1000 exercise the vector tail and body.
TEST(Softmax, LastDimMatchesDoubleReference) {
  for (int64_t n : {37, 1000}) {
    Tensor x = randn_seeded({6, n}, 1, 4.0);
    std::vector<double> xd = doubles(x);
    expect_close(doubles(softmax(x, -1)), ref_softmax(xd, {6, n}, 1, false), 1e-7, 1e-5);
    expect_close(doubles(log_softmax(x, 1)), ref_softmax(xd, {6, n}, 1, true), 1e-5, 1e-6);
  }
}

// Any dim, on a non-contiguous (transposed) input: dim 0 and a middle dim of a permuted view.
TEST(Softmax, OtherDimsOnStridedInput) {
  Tensor base = randn_seeded({4, 6, 5}, 2, 3.0);
  Tensor x = base.transpose(0, 2);  // [5, 6, 4], strided
  ASSERT_FALSE(x.is_contiguous());
  std::vector<double> xd = doubles(x);  // row-major values of the view
  for (int64_t d : {0, 1, 2}) {
    Tensor y = softmax(x, d);
    EXPECT_EQ(y.sizes(), x.sizes());
    expect_close(doubles(y), ref_softmax(xd, x.sizes(), d, false), 1e-7, 1e-5);
    expect_close(doubles(log_softmax(x, d - 3)), ref_softmax(xd, x.sizes(), d, true), 1e-5, 1e-6);
  }
}

// Max subtraction keeps huge logits finite; an all -inf row is NaN like torch; a 0-dim input
// has softmax 1 and log_softmax 0.
TEST(Softmax, NumericalEdgeCases) {
  Tensor x = from_vector<float>({1000.f, 1001.f, 999.f, -1e30f, 0.f, 0.f}, {2, 3});
  std::vector<double> y = doubles(softmax(x, 1));
  std::vector<double> want = ref_softmax({1000, 1001, 999, -1e30, 0, 0}, {2, 3}, 1, false);
  expect_close(y, want, 1e-7, 1e-5);
  std::vector<double> ly = doubles(log_softmax(x, 1));
  EXPECT_NEAR(ly[1], -std::log1p(std::exp(-1.0) + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(ly[3], -1e30, 1e24);

  float inf = std::numeric_limits<float>::infinity();
  Tensor all_inf = from_vector<float>({-inf, -inf, 1.f, 2.f}, {2, 2});
  std::vector<double> ni = doubles(softmax(all_inf, 1));
  EXPECT_TRUE(std::isnan(ni[0]) && std::isnan(ni[1]));
  EXPECT_NEAR(ni[3], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);

  Tensor s = scalar_tensor(3.5);
  EXPECT_EQ(softmax(s, 0).dim(), 0);
  EXPECT_FLOAT_EQ(softmax(s, 0).item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(log_softmax(s, -1).item<float>(), 0.0f);
}

// bf16/f16 inputs compute in fp32 and round the output once: the error is the output rounding,
// 2^-9 relative for bf16 (8-bit mantissa) and 2^-12 for f16; 1e-2 / 2e-3 leave ~2x margin.
// The reference is taken on the (already rounded) low-precision input values.
TEST(Softmax, ReducedPrecision) {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    double tol = dt == DType::BFloat16 ? 1e-2 : 2e-3;
    Tensor x = randn_seeded({3, 300}, 3, 3.0).to(dt);
    std::vector<double> xd = doubles(x);
    Tensor y = softmax(x, -1);
    EXPECT_EQ(y.dtype(), dt);
    expect_close(doubles(y), ref_softmax(xd, {3, 300}, 1, false), 1e-6, tol);
    Tensor ly = log_softmax(x, -1);
    expect_close(doubles(ly), ref_softmax(xd, {3, 300}, 1, true), 1e-3, tol);
  }
}

// The analytic gradients (softmax_backward / log_softmax_backward through autograd) agree with
// central differences, on contiguous and on transposed leaves, for the last and a leading dim.
TEST(Softmax, Gradcheck) {
  Tensor a = randn_seeded({3, 7}, 4).set_requires_grad(true);
  Tensor b = randn_seeded({7, 3}, 5).t().set_requires_grad(true);  // non-contiguous leaf
  ASSERT_FALSE(b.is_contiguous());
  for (const Tensor& x : {a, b}) {
    for (int64_t d : {-1, 0}) {
      auto r1 = autograd::gradcheck([d](const TensorList& in) { return softmax(in[0], d); }, {x});
      EXPECT_TRUE(r1.ok) << r1.message;
      auto r2 =
          autograd::gradcheck([d](const TensorList& in) { return log_softmax(in[0], d); }, {x});
      EXPECT_TRUE(r2.ok) << r2.message;
    }
  }
}

// The backward kernels against their closed forms in double (also on bf16, ~1e-2 relative).
TEST(Softmax, BackwardKernelsMatchFormula) {
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    double tol = dt == DType::Float32 ? 1e-5 : 2e-2;
    Tensor x = randn_seeded({4, 50}, 6, 2.0);
    Tensor g = randn_seeded({4, 50}, 7).to(dt);
    Tensor y = softmax(x, 1).to(dt), ly = log_softmax(x, 1).to(dt);
    std::vector<double> yd = doubles(y), lyd = doubles(ly), gd = doubles(g);
    std::vector<double> want(yd.size()), lwant(yd.size());
    for (int r = 0; r < 4; ++r) {
      double s = 0, sg = 0;
      for (int j = 0; j < 50; ++j) s += gd[r * 50 + j] * yd[r * 50 + j], sg += gd[r * 50 + j];
      for (int j = 0; j < 50; ++j) {
        int i = r * 50 + j;
        want[i] = yd[i] * (gd[i] - s);
        lwant[i] = gd[i] - std::exp(lyd[i]) * sg;
      }
    }
    expect_close(doubles(softmax_backward(g, y, 1)), want, 1e-6, tol);
    expect_close(doubles(log_softmax_backward(g, ly, -1)), lwant, 1e-5, tol);
  }
}

// Bad input is a td::Error: integer input, dim out of range, mismatched backward shapes.
TEST(Softmax, BadInputErrors) {
  EXPECT_THROW(softmax(arange(0, 6).view({2, 3}), 1), Error);
  EXPECT_THROW(softmax(zeros({2, 3}), 2), Error);
  EXPECT_THROW(log_softmax(zeros({2, 3}), -3), Error);
  EXPECT_THROW(softmax_backward(zeros({2, 3}), zeros({3, 2}), 1), Error);
  EXPECT_THROW(log_softmax_backward(Tensor(), zeros({3, 2}), 1), Error);
}

// A broadcast (stride-0) upstream gradient, as sum() produces: each softmax row sums to 1, so
// d(sum softmax(x))/dx is 0 (up to fp32 rounding of O(1) terms: 1e-6).
TEST(Softmax, ExpandedUpstreamGradient) {
  Tensor x = randn_seeded({3, 9}, 8).set_requires_grad(true);
  sum(softmax(x, 1)).backward();
  for (float v : to_vector<float>(x.grad())) EXPECT_NEAR(v, 0.0f, 1e-6);
}
