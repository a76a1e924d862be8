#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// Groups the elements of a row-major tensor by output position (reduced coords dropped).
// Returns, for each output element (in keepdim row-major order), the list of its inputs.
std::vector<std::vector<double>> groups(const std::vector<double>& v, const Shape& shape,
                                        const Shape& dims) {
  Shape keep = shape;
  std::vector<bool> red(shape.size(), dims.empty());
  for (int64_t d : dims) red[d < 0 ? d + static_cast<int64_t>(shape.size()) : d] = true;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (red[d]) keep[d] = 1;
  }
  std::vector<std::vector<double>> out(numel_of(keep));
  Shape idx(shape.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t o = 0;
    for (size_t d = 0; d < shape.size(); ++d) o = o * keep[d] + (red[d] ? 0 : idx[d]);
    out[o].push_back(v[i]);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

template <typename F>
std::vector<double> ref_reduce(const Tensor& x, const Shape& dims, F f) {
  std::vector<double> r;
  for (const auto& g : groups(doubles(x), x.sizes(), dims)) r.push_back(f(g));
  return r;
}

double dsum(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double dvar(const std::vector<double>& g, int64_t corr) {
  double m = dsum(g) / g.size(), ss = 0;
  for (double v : g) ss += (v - m) * (v - m);
  return ss / static_cast<double>(g.size() - corr);
}

void expect_near_vec(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                     double atol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " element " << i;
  }
}

}  // namespace

// ---------------- sum / mean ----------------

// sum/mean over leading, middle, trailing and all dims, with and without keepdim, on
// contiguous and transposed inputs, match a double reference to fp32 rounding (1e-6 relative
// of the sum of |x|, covered by 1e-5 absolute for these O(10)-sized sums).
TEST(Reduction, SumMeanMatchReference) {
  Tensor base = randn_seeded({4, 5, 6}, 1);
  for (const Tensor& x : {base, base.transpose(0, 2)}) {
    for (Shape dims : {Shape{0}, Shape{1}, Shape{2}, Shape{0, 2}, Shape{}, Shape{-1}}) {
      for (bool keepdim : {false, true}) {
        Tensor s = sum(x, dims, keepdim), m = mean(x, dims, keepdim);
        auto want = ref_reduce(x, dims, dsum);
        expect_near_vec(to_vector<float>(s), want, 1e-6, 1e-5, "sum");
        std::vector<double> wm;
        auto gs = groups(doubles(x), x.sizes(), dims);
        for (const auto& g : gs) wm.push_back(dsum(g) / g.size());
        expect_near_vec(to_vector<float>(m), wm, 1e-6, 1e-6, "mean");
        // Shapes: keepdim keeps reduced dims as 1; otherwise they are dropped.
        Shape expect;
        for (int64_t d = 0; d < x.dim(); ++d) {
          bool red = dims.empty() || std::find(dims.begin(), dims.end(), d) != dims.end() ||
                     std::find(dims.begin(), dims.end(), d - x.dim()) != dims.end();
          if (!red)
            expect.push_back(x.size(d));
          else if (keepdim)
            expect.push_back(1);
        }
        EXPECT_EQ(s.sizes(), expect);
        EXPECT_EQ(m.sizes(), expect);
      }
    }
  }
}

// bf16 inputs accumulate in fp32 or better: summing 4096 copies of 1 + 2^-7 (exact in bf16)
// gives 4128 exactly before the final rounding (a bf16 accumulator would stall at 256 + ...).
// The result rounds once to bf16; leading-dim and trailing-dim paths agree.
TEST(Reduction, SumBf16AccumulatesInFp32) {
  Tensor x = full({4096, 2}, 1.0 + 1.0 / 128).to(DType::BFloat16);
  Tensor s0 = sum(x, {0});
  EXPECT_EQ(s0.dtype(), DType::BFloat16);
  float want = static_cast<float>(BFloat16(4096.0f * (1.0f + 1.0f / 128)));
  EXPECT_EQ(to_vector<float>(s0), (std::vector<float>{want, want}));
  Tensor s1 = sum(x.t(), {1});
  EXPECT_EQ(to_vector<float>(s1), (std::vector<float>{want, want}));
  Tensor m = mean(x, {0});
  EXPECT_EQ(to_vector<float>(m), (std::vector<float>{1.0f + 1.0f / 128, 1.0f + 1.0f / 128}));
  // Random bf16: equals the double sum of the bf16 values rounded to bf16 (within 1 bf16 ulp).
  Tensor r = randn_seeded({64, 33}, 2).to(DType::BFloat16);
  auto want_r = ref_reduce(r, {1}, dsum);
  auto got_r = to_vector<float>(sum(r, {1}));
  for (size_t i = 0; i < got_r.size(); ++i) {
    EXPECT_NEAR(got_r[i], want_r[i], std::fabs(want_r[i]) * (1.0 / 128) + 1e-6) << i;
  }
}

// Integer sums are exact and return int64.
TEST(Reduction, SumIntegers) {
  Tensor x = arange(0, 12).to(DType::Int32).view({3, 4});
  Tensor s = sum(x, {0});
  EXPECT_EQ(s.dtype(), DType::Int64);
  EXPECT_EQ(to_vector<int64_t>(s), (std::vector<int64_t>{12, 15, 18, 21}));
  EXPECT_EQ(sum(x).item<int64_t>(), 66);
  EXPECT_THROW(mean(x), Error);
}

// Gradients of sum/mean (leading, middle, keepdim) agree with finite differences.
TEST(Reduction, SumMeanGradcheck) {
  Tensor x = randn_seeded({3, 4, 2}, 3).set_requires_grad(true);
  Tensor xt = randn_seeded({2, 4, 3}, 4).transpose(0, 2).set_requires_grad(true);
  for (const Tensor& in : {x, xt}) {
    for (Shape dims : {Shape{0}, Shape{1}, Shape{0, 2}, Shape{}}) {
      for (bool keep : {false, true}) {
        auto r1 =
            autograd::gradcheck([&](const TensorList& a) { return sum(a[0], dims, keep); }, {in});
        EXPECT_TRUE(r1.ok) << r1.message;
        auto r2 =
            autograd::gradcheck([&](const TensorList& a) { return mean(a[0], dims, keep); }, {in});
        EXPECT_TRUE(r2.ok) << r2.message;
      }
    }
  }
}

// Sums over the leading dims of tall inputs take the row-block path (Note [Leading
// reductions]): R = 1000 rows make 15 blocks of 67 rows (the last one shorter, and not a
// multiple of the four-row step). fp32 matches the double reference to fp32 rounding of the
// result (1e-6 relative, plus 1e-5 absolute for sums near 0 of ~30-sized magnitude); int32 sums
// are exact; a leading [2, 500] of a 3-D input reduces the same way.
TEST(Reduction, SumLeadingRowBlocksMatchReference) {
  Tensor x = randn_seeded({1000, 37}, 6);
  expect_near_vec(to_vector<float>(sum(x, {0})), ref_reduce(x, {0}, dsum), 1e-6, 1e-5, "fp32");
  Tensor x3 = randn_seeded({2, 500, 9}, 7);
  expect_near_vec(to_vector<float>(sum(x3, {0, 1})), ref_reduce(x3, {0, 1}, dsum), 1e-6, 1e-5,
                  "fp32 3-D");
  Tensor xi = arange(0, 1000 * 5).to(DType::Int32).view({1000, 5});
  std::vector<int64_t> want(5, 0);
  for (int64_t r = 0; r < 1000; ++r) {
    for (int64_t c = 0; c < 5; ++c) want[c] += r * 5 + c;
  }
  EXPECT_EQ(to_vector<int64_t>(sum(xi, {0})), want);
}

// Large sums are identical for 1 and 2 threads (leading and trailing paths).
TEST(Reduction, SumDeterministicAcrossThreads) {
  Tensor x = randn_seeded({512, 300}, 5);
  std::vector<float> a0, a1, b0, b1;
  {
    ThreadCount tc(1);
    a0 = to_vector<float>(sum(x, {0}));
    a1 = to_vector<float>(sum(x, {1}));
  }
  {
    ThreadCount tc(2);
    b0 = to_vector<float>(sum(x, {0}));
    b1 = to_vector<float>(sum(x, {1}));
  }
  EXPECT_EQ(a0, b0);
  EXPECT_EQ(a1, b1);
}

// ---------------- max / min / amax / argmax ----------------

// max/min of everything: 0-dim, exact, on a strided input; NaN propagates.
TEST(Reduction, MaxMinAll) {
  Tensor x = randn_seeded({70, 300}, 6);  // > one block of the blocked reduction
  Tensor xt = x.t();
  auto v = doubles(x);
  double mx = *std::max_element(v.begin(), v.end()), mn = *std::min_element(v.begin(), v.end());
  Tensor m = max(xt);
  EXPECT_EQ(m.dim(), 0);
  EXPECT_EQ(m.item<float>(), static_cast<float>(mx));
  EXPECT_EQ(min(xt).item<float>(), static_cast<float>(mn));
  Tensor xi = from_vector<int64_t>({3, -7, 12, 5}, {2, 2});
  EXPECT_EQ(max(xi).item<int64_t>(), 12);
  EXPECT_EQ(min(xi).item<int64_t>(), -7);
  EXPECT_EQ(max(from_vector<float>({1, 2, 3}, {3}).to(DType::BFloat16)).item<float>(), 3.0f);
  EXPECT_TRUE(std::isnan(max(from_vector<float>({1, NAN, 3}, {3})).item<float>()));
  EXPECT_TRUE(std::isnan(min(from_vector<float>({1, 3, NAN}, {3})).item<float>()));
}

// The gradient of max() is split evenly between tied maxima.
TEST(Reduction, MaxAllGradientSplitsTies) {
  Tensor x = from_vector<float>({1, 5, 2, 5, 5, 0}, {2, 3}).set_requires_grad(true);
  max(x).backward();
  const float third = 1.0f / 3.0f;
  expect_near_vec(to_vector<float>(x.grad()), {0, third, 0, third, third, 0}, 1e-7, 0, "grad");
  Tensor y = from_vector<float>({4, -2, 9}, {3}).set_requires_grad(true);
  min(y).backward();
  EXPECT_EQ(to_vector<float>(y.grad()), (std::vector<float>{0, 1, 0}));
}

// max(x, dim): values and first-maximum int64 indices on every dim, keepdim, transposed.
TEST(Reduction, MaxDim) {
  Tensor base = randn_seeded({3, 4, 5}, 7);
  for (const Tensor& x : {base, base.permute({2, 0, 1})}) {
    for (int64_t d = -1; d < x.dim(); ++d) {
      for (bool keep : {false, true}) {
        auto [vals, idx] = max(x, d, keep);
        EXPECT_EQ(idx.dtype(), DType::Int64);
        EXPECT_EQ(vals.sizes(), idx.sizes());
        int64_t dd = d < 0 ? d + x.dim() : d;
        EXPECT_EQ(vals.dim(), keep ? x.dim() : x.dim() - 1);
        auto gs = groups(doubles(x), x.sizes(), {dd});
        auto vv = to_vector<float>(vals);
        auto ii = to_vector<int64_t>(idx);
        for (size_t r = 0; r < gs.size(); ++r) {
          auto it = std::max_element(gs[r].begin(), gs[r].end());
          EXPECT_EQ(vv[r], static_cast<float>(*it));
          EXPECT_EQ(ii[r], it - gs[r].begin());
        }
      }
    }
  }
  // Ties: the first maximum.
  Tensor t = from_vector<float>({2, 7, 7, 1, 3, 3, 3, 0}, {2, 4});
  EXPECT_EQ(to_vector<int64_t>(max(t, 1).second), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(to_vector<int64_t>(argmax(t, 1)), (std::vector<int64_t>{1, 0}));
}

// The gradient of max(x, dim).values goes to the chosen index only (ties included).
TEST(Reduction, MaxDimGradient) {
  Tensor x = from_vector<float>({2, 7, 7, 1, 3, 3, 3, 0}, {2, 4}).set_requires_grad(true);
  auto [v, i] = max(x, 1);
  v.backward(from_vector<float>({10, 20}, {2}));
  EXPECT_EQ(to_vector<float>(x.grad()), (std::vector<float>{0, 10, 0, 0, 20, 0, 0, 0}));
  Tensor y =
      randn_seeded({4, 3, 5}, 8).transpose(0, 2).set_requires_grad(true);  // no ties (continuous)
  for (int64_t d : {0, 1, 2}) {
    for (bool keep : {false, true}) {
      auto r =
          autograd::gradcheck([&](const TensorList& a) { return max(a[0], d, keep).first; }, {y});
      EXPECT_TRUE(r.ok) << r.message;
    }
  }
}

TEST(Reduction, ArgmaxAll) {
  Tensor x = from_vector<float>({1, 9, 3, 9, -2, 0}, {2, 3});
  Tensor a = argmax(x);
  EXPECT_EQ(a.dim(), 0);
  EXPECT_EQ(a.item<int64_t>(), 1);
  EXPECT_EQ(argmax(x, std::nullopt, true).sizes(), (Shape{1, 1}));
  EXPECT_EQ(to_vector<int64_t>(argmax(x, 0)), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(to_vector<int64_t>(argmax(x, 0, true)).size(), 3u);
  EXPECT_EQ(argmax(x, -1, true).sizes(), (Shape{2, 1}));
  // x.t() is [[1, 9], [9, -2], [3, 0]]: the first 9 in its logical order is element 1.
  EXPECT_EQ(argmax(x.t()).item<int64_t>(), 1);
  // [[1, 3], [9, 3]].t() = [[1, 9], [3, 3]]: logical index 1 (memory index 2).
  EXPECT_EQ(argmax(from_vector<float>({1, 3, 9, 3}, {2, 2}).t()).item<int64_t>(), 1);
}

// amax over several dims matches the reference; its gradient splits ties evenly.
TEST(Reduction, Amax) {
  Tensor base = randn_seeded({3, 4, 5}, 9);
  for (Shape dims : {Shape{0}, Shape{1, 2}, Shape{0, 2}, Shape{}}) {
    for (bool keep : {false, true}) {
      Tensor y = amax(base.transpose(0, 1), dims, keep);
      auto want = ref_reduce(base.transpose(0, 1), dims, [](const std::vector<double>& g) {
        return *std::max_element(g.begin(), g.end());
      });
      expect_near_vec(to_vector<float>(y), want, 0, 0, "amax");
    }
  }
  // Column 0 [1, 4, 3] has one maximum; column 1 [4, 4, 0] a tie that shares 8 as 4 + 4.
  Tensor x = from_vector<float>({1, 4, 4, 4, 3, 0}, {3, 2}).set_requires_grad(true);
  amax(x, {0}).backward(from_vector<float>({6, 8}, {2}));
  EXPECT_EQ(to_vector<float>(x.grad()), (std::vector<float>{0, 4, 6, 4, 0, 0}));
  Tensor z = randn_seeded({3, 4}, 10).set_requires_grad(true);
  auto r = autograd::gradcheck([](const TensorList& a) { return amax(a[0], {1}, true); }, {z});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Reduction, ExtremumBadInput) {
  EXPECT_THROW(max(zeros({0})), Error);
  EXPECT_THROW(min(zeros({2, 0})), Error);
  EXPECT_THROW(argmax(zeros({0})), Error);
  EXPECT_THROW(max(zeros({3, 0}), 1), Error);
  EXPECT_THROW(max(zeros({3, 2}), 2), Error);
  EXPECT_THROW(amax(zeros({3, 2}), {0, 0}), Error);
  EXPECT_THROW(max(Tensor()), Error);
  // Reducing a non-empty dim of a tensor with another empty dim is fine (empty result).
  EXPECT_EQ(max(zeros({0, 3}), 1).first.sizes(), (Shape{0}));
  try {
    max(zeros({0}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max"), std::string::npos);
  }
}

// ---------------- var / norm ----------------

// var (corrections 0 and 1, several dims, keepdim) matches the two-pass double reference; a
// large offset (1e4 + N(0,1)) would lose all digits in a one-pass E[x^2]-E[x]^2 in fp32.
TEST(Reduction, VarMatchesReference) {
  Tensor x = add(randn_seeded({6, 7, 8}, 11), 1e4);
  for (Shape dims : {Shape{0}, Shape{2}, Shape{0, 1}, Shape{}}) {
    for (int64_t corr : {0, 1}) {
      for (bool keep : {false, true}) {
        Tensor v = var(x.transpose(1, 2), dims, corr, keep);
        auto want = ref_reduce(x.transpose(1, 2), dims,
                               [corr](const std::vector<double>& g) { return dvar(g, corr); });
        expect_near_vec(to_vector<float>(v), want, 1e-5, 0, "var");
      }
    }
  }
  // One element with correction 1: 0/0 = NaN, as in torch.
  EXPECT_TRUE(std::isnan(var(ones({1})).item<float>()));
  EXPECT_THROW(var(arange(0, 4)), Error);
}

TEST(Reduction, VarGradcheck) {
  Tensor x = randn_seeded({3, 5}, 12).set_requires_grad(true);
  Tensor xt = randn_seeded({5, 3}, 13).t().set_requires_grad(true);
  for (const Tensor& in : {x, xt}) {
    for (Shape dims : {Shape{0}, Shape{1}, Shape{}}) {
      for (int64_t corr : {0, 1}) {
        auto r = autograd::gradcheck(
            [&](const TensorList& a) { return var(a[0], dims, corr, true); }, {in});
        EXPECT_TRUE(r.ok) << r.message;
      }
    }
  }
}

// norm: sqrt of the double sum of squares, rounded once; thread-count independent; gradient
// x/|x| (0 at x == 0).
TEST(Reduction, Norm) {
  Tensor x = randn_seeded({300, 200}, 14);
  double ss = 0;
  for (double v : doubles(x)) ss += v * v;
  Tensor n = norm(x.t());
  EXPECT_EQ(n.dim(), 0);
  EXPECT_EQ(n.item<float>(), static_cast<float>(std::sqrt(ss)));
  float a, b;
  {
    ThreadCount tc(1);
    a = norm(x).item<float>();
  }
  {
    ThreadCount tc(2);
    b = norm(x).item<float>();
  }
  EXPECT_EQ(a, b);
  // bf16 input: fp32/double accumulation, 0-dim bf16 result.
  Tensor big = full({100000}, 1.0).to(DType::BFloat16);
  Tensor nb = norm(big);
  EXPECT_EQ(nb.dtype(), DType::BFloat16);
  EXPECT_EQ(nb.item<float>(), static_cast<float>(BFloat16(static_cast<float>(std::sqrt(1e5)))));
  Tensor z = randn_seeded({4, 3}, 15).set_requires_grad(true);
  auto r = autograd::gradcheck([](const TensorList& in) { return norm(in[0]); }, {z});
  EXPECT_TRUE(r.ok) << r.message;
  Tensor zero = zeros({3}).set_requires_grad(true);
  norm(zero).backward();
  EXPECT_EQ(to_vector<float>(zero.grad()), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(norm(zeros({0})).item<float>(), 0.0f);
  EXPECT_THROW(norm(arange(0, 3)), Error);
}
