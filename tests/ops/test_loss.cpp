#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// torch's cross entropy with label smoothing in double, per row (NaN marks ignored rows), and
// the gradient of sum_r w_r * loss_r (w_r = 1 if `w` is empty).
struct RefCe {
  std::vector<double> loss;  // per row; ignored rows 0
  int64_t count = 0;
  std::vector<double> grad;  // d(sum_r w_r loss_r)/dx
};

RefCe ref_ce(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t C, int64_t ignore,
             double eps, const std::vector<double>& w = {}) {
  int64_t rows = static_cast<int64_t>(t.size());
  RefCe r;
  r.loss.assign(rows, 0.0);
  r.grad.assign(x.size(), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    if (t[i] == ignore) continue;
    ++r.count;
    const double* xr = &x[i * C];
    double m = -INFINITY, s = 0, sumlp = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, xr[c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(xr[c] - m);
    double lse = m + std::log(s);
    for (int64_t c = 0; c < C; ++c) sumlp += xr[c] - lse;
    r.loss[i] = (1 - eps) * (lse - xr[t[i]]) - eps / C * sumlp;
    double wi = w.empty() ? 1.0 : w[i];
    for (int64_t c = 0; c < C; ++c) {
      double p = std::exp(xr[c] - lse);
      r.grad[i * C + c] = wi * (p - eps / C - (c == t[i] ? 1 - eps : 0.0));
    }
  }
  return r;
}

}  // namespace

// Loss values for the three reductions, with and without label smoothing and with ignored
// rows, on [2, 3, C] logits (any leading shape) and int64/int32 targets. fp32 per-row losses of
// O(1): 1e-5 relative; the Mean divides by the non-ignored rows only (torch's rule).
TEST(CrossEntropy, ForwardMatchesDoubleReference) {
  const int64_t C = 11;
  Tensor x = randn_seeded({2, 3, C}, 1, 3.0);
  std::vector<int64_t> t = {3, -100, 0, 10, 7, -100};
  for (double eps : {0.0, 0.1}) {
    for (DType tt : {DType::Int64, DType::Int32}) {
      Tensor tgt = from_vector<int64_t>(t, {2, 3}).to(tt);
      RefCe r = ref_ce(doubles(x), t, C, -100, eps);
      Tensor none = cross_entropy(x, tgt, -100, Reduction::None, eps);
      EXPECT_EQ(none.sizes(), (Shape{2, 3}));
      expect_close(doubles(none), r.loss, 1e-6, 1e-5, "none");
      double total = 0;
      for (double l : r.loss) total += l;
      Tensor sum = cross_entropy(x, tgt, -100, Reduction::Sum, eps);
      EXPECT_EQ(sum.dim(), 0);
      EXPECT_NEAR(sum.item<float>(), total, 1e-5 * std::fabs(total));
      EXPECT_NEAR(cross_entropy(x, tgt, -100, Reduction::Mean, eps).item<float>(), total / r.count,
                  1e-5 * std::fabs(total / r.count));
    }
  }
}

// A custom ignore_index that is a valid class id is ignored, not scored; large logits stay
// finite and precise (loss formed from (x - max), not from a rounded logsumexp).
TEST(CrossEntropy, IgnoreIndexAndLargeLogits) {
  Tensor x = from_vector<float>({1000.f, 1001.f, 999.f, 0.f, 1.f, 2.f}, {2, 3});
  Tensor t = from_vector<int64_t>({0, 2}, {2});
  RefCe r = ref_ce({1000, 1001, 999, 0, 1, 2}, {0, 2}, 3, -100, 0.0);
  expect_close(doubles(cross_entropy(x, t, -100, Reduction::None)), r.loss, 1e-6, 1e-6);
  // ignore_index = 2 drops row 1; the mean is row 0's loss.
  EXPECT_NEAR(cross_entropy(x, t, 2, Reduction::Mean).item<float>(), r.loss[0], 1e-6);
}

// Every row ignored: Mean is NaN (0/0) like torch, Sum is 0, and the gradient is all zeros.
TEST(CrossEntropy, AllIgnored) {
  Tensor x = randn_seeded({3, 4}, 2).set_requires_grad(true);
  Tensor t = from_vector<int64_t>({-100, -100, -100}, {3});
  Tensor m = cross_entropy(x, t);
  EXPECT_TRUE(std::isnan(m.item<float>()));
  EXPECT_EQ(cross_entropy(x, t, -100, Reduction::Sum).item<float>(), 0.0f);
  m.backward();
  for (float v : to_vector<float>(x.grad())) EXPECT_EQ(v, 0.0f);
}

// The fused backward against the double gradient, for Mean (1/count scale), Sum and None
// (per-row upstream grads), with smoothing, on a transposed (non-contiguous) logits leaf.
TEST(CrossEntropy, BackwardMatchesDoubleReference) {
  const int64_t C = 37;
  std::vector<int64_t> t = {5, 36, -1, 0, 12};
  Tensor base = randn_seeded({C, 5}, 3, 2.0);
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    Tensor x = base.t().set_requires_grad(true);  // [5, C] strided leaf
    ASSERT_FALSE(x.is_contiguous());
    Tensor tgt = from_vector<int64_t>(t, {5});
    Tensor loss = cross_entropy(x, tgt, -1, red, 0.05);
    std::vector<double> w(5, 1.0);
    if (red == Reduction::None) {
      Tensor g = randn_seeded({5}, 4);
      w = doubles(g);
      loss.backward(g);
    } else {
      loss.backward();
    }
    RefCe r = ref_ce(doubles(x), t, C, -1, 0.05, w);
    if (red == Reduction::Mean) {
      for (double& v : r.grad) v /= r.count;
    }
    expect_close(doubles(x.grad()), r.grad, 1e-6, 1e-4, "grad");
  }
}

// Gradcheck through the fused op (central differences), with smoothing and an ignored row.
TEST(CrossEntropy, Gradcheck) {
  Tensor x = randn_seeded({4, 6}, 5).set_requires_grad(true);
  Tensor t = from_vector<int64_t>({1, 5, -100, 0}, {4});
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    auto r = autograd::gradcheck(
        [t, red](const TensorList& in) { return cross_entropy(in[0], t, -100, red, 0.1); }, {x});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// bf16 logits compute in fp32: per-row losses are exact up to the bf16 output rounding (2^-9
// relative, 1e-2 bound) against the double reference of the rounded logits; the gradient is
// rounded to bf16 once (1e-2 relative + small absolute for near-zero probabilities).
TEST(CrossEntropy, BFloat16Logits) {
  const int64_t C = 50;
  Tensor x = randn_seeded({4, C}, 6, 2.0).to(DType::BFloat16);
  std::vector<int64_t> t = {0, 49, 17, 3};
  Tensor tgt = from_vector<int64_t>(t, {4});
  RefCe r = ref_ce(doubles(x), t, C, -100, 0.0);
  Tensor none = cross_entropy(x, tgt, -100, Reduction::None);
  EXPECT_EQ(none.dtype(), DType::BFloat16);
  expect_close(doubles(none), r.loss, 1e-3, 1e-2, "loss");
  Tensor xl = x.detach().set_requires_grad(true);
  cross_entropy(xl, tgt, -100, Reduction::Sum).backward();
  EXPECT_EQ(xl.grad().dtype(), DType::BFloat16);
  expect_close(doubles(xl.grad()), r.grad, 1e-4, 1e-2, "grad");
}

// Out-of-range targets name the value and C; shape and dtype mistakes are td::Errors.
TEST(CrossEntropy, BadInputErrors) {
  Tensor x = zeros({3, 5});
  try {
    cross_entropy(x, from_vector<int64_t>({0, 5, 1}, {3}));
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("target 5"), std::string::npos) << m;
    EXPECT_NE(m.find("5 classes"), std::string::npos) << m;
  }
  EXPECT_THROW(cross_entropy(x, from_vector<int64_t>({0, -2, 1}, {3})), Error);
  EXPECT_THROW(cross_entropy(x, from_vector<int64_t>({0, 1}, {2})), Error);    // shape
  EXPECT_THROW(cross_entropy(x, zeros({3})), Error);                           // float target
  EXPECT_THROW(cross_entropy(arange(0, 15).view({3, 5}), zeros({3})), Error);  // int logits
  EXPECT_THROW(cross_entropy(x, from_vector<int64_t>({0, 1, 2}, {3}), -100, Reduction::Mean, 1.5),
               Error);  // label_smoothing out of [0, 1]
}

// The in-place kernel of the chunked LM head: its summed loss and the gradient it leaves in the
// logits equal cross_entropy(Sum) and that op's autograd gradient (fp32 rows of 300 classes:
// rounding-level, 1e-6 relative), ignored rows are zero, and a bad target is an error that
// leaves the logits untouched.
TEST(CrossEntropy, SumAndGradInPlace) {
  Generator gen(31);
  Tensor x = mul(randn({13, 300}, {}, &gen), 3.0);
  Tensor t = randint(0, 300, {13}, {DType::Int64}, &gen);
  t.narrow(0, 4, 2).fill_(-100);
  Tensor xr = x.clone().set_requires_grad(true);
  Tensor ref = cross_entropy(xr, t, -100, Reduction::Sum);
  ref.backward();
  Tensor l = x.clone();
  const double total = cross_entropy_sum_and_grad_(l, t, -100);
  EXPECT_NEAR(total, ref.item<double>(), 1e-6 * std::fabs(ref.item<double>()));
  auto got = to_vector<float>(l), want = to_vector<float>(xr.grad());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  EXPECT_EQ(sum(abs(l.narrow(0, 4, 2))).item<float>(), 0.0f);
  Tensor keep = x.clone();
  EXPECT_THROW(cross_entropy_sum_and_grad_(keep, full({13}, 300, {DType::Int64})), Error);
  EXPECT_EQ(sum(ne(keep, x)).item<int64_t>(), 0);
  EXPECT_THROW(cross_entropy_sum_and_grad_(x.to(DType::BFloat16), t), Error);  // fp32 only
}
