#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// Double reference of layer_norm (rms = false) or rms_norm over rows of n; w/b may be empty.
struct RefNorm {
  std::vector<double> y, mean, rstd, dx, dw, db;
};

RefNorm ref_norm(const std::vector<double>& x, int64_t n, const std::vector<double>& w,
                 const std::vector<double>& b, double eps, bool rms,
                 const std::vector<double>& g = {}) {
  int64_t rows = static_cast<int64_t>(x.size()) / n;
  RefNorm r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.dw.assign(n, 0.0);
  r.db.assign(n, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * n];
    double mu = 0, ss = 0;
    if (!rms) {
      for (int64_t j = 0; j < n; ++j) mu += xr[j];
      mu /= n;
    }
    for (int64_t j = 0; j < n; ++j) ss += (xr[j] - mu) * (xr[j] - mu);
    double rstd = 1.0 / std::sqrt(ss / n + eps);
    r.mean.push_back(mu);
    r.rstd.push_back(rstd);
    std::vector<double> xh(n), gw(n);
    for (int64_t j = 0; j < n; ++j) {
      xh[j] = (xr[j] - mu) * rstd;
      r.y[i * n + j] = xh[j] * (w.empty() ? 1.0 : w[j]) + (b.empty() ? 0.0 : b[j]);
    }
    if (g.empty()) continue;
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      gw[j] = g[i * n + j] * (w.empty() ? 1.0 : w[j]);
      s1 += gw[j];
      s2 += gw[j] * xh[j];
      r.dw[j] += g[i * n + j] * xh[j];
      r.db[j] += g[i * n + j];
    }
    for (int64_t j = 0; j < n; ++j) {
      r.dx[i * n + j] = rstd * (gw[j] - (rms ? 0.0 : s1 / n) - xh[j] * s2 / n);
    }
  }
  return r;
}

}  // namespace

// layer_norm over a 2-dim normalized_shape, with weight and bias, matches the double reference
// (fp32 rounding of O(1) values: 1e-5 is ~100 ulp, generous for 24-value rows); the saved
// statistics are fp32 per-row mean and 1/sqrt(var + eps) (biased variance, like torch).
TEST(LayerNorm, ForwardMatchesDoubleReference) {
  Tensor x = randn_seeded({4, 3, 8}, 1, 2.0, 5.0);  // offset mean: tests the centring
  Tensor w = randn_seeded({3, 8}, 2), b = randn_seeded({3, 8}, 3);
  RefNorm r = ref_norm(doubles(x), 24, doubles(w), doubles(b), 1e-5, false);
  Tensor y = layer_norm(x, {3, 8}, w, b, 1e-5);
  EXPECT_EQ(y.sizes(), x.sizes());
  expect_close(doubles(y), r.y, 1e-5, 1e-5, "y");
  NormForward f = layer_norm_forward(x, 24, w, b, 1e-5);
  EXPECT_EQ(f.mean.dtype(), DType::Float32);
  EXPECT_EQ(f.rstd.sizes(), (Shape{4}));
  expect_close(doubles(f.mean), r.mean, 1e-6, 1e-6, "mean");
  expect_close(doubles(f.rstd), r.rstd, 0, 1e-5, "rstd");
  // Without weight, without bias, and with neither.
  expect_close(doubles(layer_norm(x, {3, 8}, Tensor(), b)),
               ref_norm(doubles(x), 24, {}, doubles(b), 1e-5, false).y, 1e-5, 1e-5, "no w");
  expect_close(doubles(layer_norm(x, {3, 8}, w)),
               ref_norm(doubles(x), 24, doubles(w), {}, 1e-5, false).y, 1e-5, 1e-5, "no b");
  expect_close(doubles(layer_norm(x, {8})), ref_norm(doubles(x), 8, {}, {}, 1e-5, false).y, 1e-5,
               1e-5, "plain");
}

// A strided (transposed) input gives the same result as its contiguous copy.
TEST(LayerNorm, StridedInput) {
  Tensor x = randn_seeded({16, 5}, 4).t();  // [5, 16], non-contiguous
  ASSERT_FALSE(x.is_contiguous());
  Tensor w = randn_seeded({16}, 5);
  RefNorm r = ref_norm(doubles(x), 16, doubles(w), {}, 1e-5, false);
  expect_close(doubles(layer_norm(x, {16}, w)), r.y, 1e-5, 1e-5);
  expect_close(doubles(rms_norm(x, {16}, w)),
               ref_norm(doubles(x), 16, doubles(w), {}, 1e-6, true).y, 1e-5, 1e-5);
}

// The fused backward's dx, dweight, dbias match the double reference. 300 rows > 64 chunks, so
// dweight/dbias go through several multi-row chunk partials (Note [Deterministic weight
// gradients]); sums over 300 rows in fp32 chunks: 1e-4 relative + 1e-4 absolute is ample.
TEST(LayerNorm, BackwardMatchesDoubleReference) {
  Tensor x = randn_seeded({300, 64}, 6, 1.5, -1.0), g = randn_seeded({300, 64}, 7);
  Tensor w = randn_seeded({64}, 8);
  RefNorm r = ref_norm(doubles(x), 64, doubles(w), {}, 1e-5, false, doubles(g));
  NormForward f = layer_norm_forward(x, 64, w, Tensor(), 1e-5);
  auto [dx, dw, db] = layer_norm_backward(g, x, f.mean, f.rstd, w, true, 64);
  expect_close(doubles(dx), r.dx, 1e-4, 1e-4, "dx");
  expect_close(doubles(dw), r.dw, 1e-4, 1e-4, "dw");
  expect_close(doubles(db), r.db, 1e-4, 1e-4, "db");
  // The same through autograd, and bitwise reproducible from run to run.
  Tensor xl = x.clone().set_requires_grad(true), wl = w.clone().set_requires_grad(true);
  Tensor bl = zeros({64}).set_requires_grad(true);
  layer_norm(xl, {64}, wl, bl).backward(g);
  EXPECT_EQ(to_vector<float>(wl.grad()), to_vector<float>(dw));
  EXPECT_EQ(to_vector<float>(bl.grad()), to_vector<float>(db));
  EXPECT_EQ(to_vector<float>(xl.grad()), to_vector<float>(dx));

  Tensor rstd = rms_norm_forward(x, 64, w, 1e-6).rstd;
  RefNorm rr = ref_norm(doubles(x), 64, doubles(w), {}, 1e-6, true, doubles(g));
  auto [rdx, rdw] = rms_norm_backward(g, x, rstd, w, 64);
  expect_close(doubles(rdx), rr.dx, 1e-4, 1e-4, "rms dx");
  expect_close(doubles(rdw), rr.dw, 1e-4, 1e-4, "rms dw");
}

// Gradients of layer_norm and rms_norm w.r.t. x, weight and bias agree with central
// differences, on a contiguous and a transposed x.
TEST(LayerNorm, Gradcheck) {
  Tensor xa = randn_seeded({3, 2, 4}, 9).set_requires_grad(true);
  Tensor xb = randn_seeded({4, 3}, 10).t().set_requires_grad(true);  // [3, 4] strided
  for (const Tensor& x : {xa, xb}) {
    Shape ns = x.dim() == 3 ? Shape{2, 4} : Shape{4};
    Tensor w = add(randn_seeded(ns, 11, 0.5), 1.0).set_requires_grad(true);
    Tensor b = randn_seeded(ns, 12).set_requires_grad(true);
    auto r1 = autograd::gradcheck(
        [ns](const TensorList& in) { return layer_norm(in[0], ns, in[1], in[2]); }, {x, w, b});
    EXPECT_TRUE(r1.ok) << r1.message;
    auto r2 = autograd::gradcheck([ns](const TensorList& in) { return rms_norm(in[0], ns, in[1]); },
                                  {x, w});
    EXPECT_TRUE(r2.ok) << r2.message;
    auto r3 =
        autograd::gradcheck([ns](const TensorList& in) { return layer_norm(in[0], ns); }, {x});
    EXPECT_TRUE(r3.ok) << r3.message;
  }
}

// rms_norm: y = x / sqrt(mean(x^2) + eps) * w, no centring.
TEST(RmsNorm, ForwardMatchesDoubleReference) {
  Tensor x = randn_seeded({5, 40}, 13, 3.0, 1.0), w = randn_seeded({40}, 14);
  RefNorm r = ref_norm(doubles(x), 40, doubles(w), {}, 1e-6, true);
  expect_close(doubles(rms_norm(x, {40}, w)), r.y, 1e-5, 1e-5);
  expect_close(doubles(rms_norm(x, {40})), ref_norm(doubles(x), 40, {}, {}, 1e-6, true).y, 1e-5,
               1e-5);
  NormForward f = rms_norm_forward(x, 40, w, 1e-6);
  EXPECT_FALSE(f.mean.defined());
  expect_close(doubles(f.rstd), r.rstd, 0, 1e-5);
}

// bf16 input and weight: statistics and arithmetic in fp32, output rounded once to bf16
// (2^-9 relative) -> 1e-2 relative plus 1e-2 absolute for outputs near 0. The reference uses
// the bf16-rounded inputs. The backward (dx, dweight) stays within the same bound.
TEST(LayerNorm, BFloat16) {
  Tensor x = randn_seeded({6, 32}, 15, 2.0).to(DType::BFloat16);
  Tensor w = randn_seeded({32}, 16).to(DType::BFloat16);
  Tensor b = randn_seeded({32}, 17).to(DType::BFloat16);
  RefNorm r = ref_norm(doubles(x), 32, doubles(w), doubles(b), 1e-5, false);
  Tensor y = layer_norm(x, {32}, w, b);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  expect_close(doubles(y), r.y, 1e-2, 1e-2, "layer_norm");
  RefNorm rr = ref_norm(doubles(x), 32, doubles(w), {}, 1e-6, true);
  expect_close(doubles(rms_norm(x, {32}, w)), rr.y, 1e-2, 1e-2, "rms_norm");

  Tensor g = randn_seeded({6, 32}, 18).to(DType::BFloat16);
  RefNorm rg = ref_norm(doubles(x), 32, doubles(w), doubles(b), 1e-5, false, doubles(g));
  NormForward f = layer_norm_forward(x, 32, w, b, 1e-5);
  auto [dx, dw, db] = layer_norm_backward(g, x, f.mean, f.rstd, w, true, 32);
  EXPECT_EQ(dx.dtype(), DType::BFloat16);
  EXPECT_EQ(dw.dtype(), DType::BFloat16);
  expect_close(doubles(dx), rg.dx, 2e-2, 1e-2, "dx");
  expect_close(doubles(dw), rg.dw, 2e-2, 1e-2, "dw");
  expect_close(doubles(db), rg.db, 2e-2, 1e-2, "db");
}

// Shape and dtype mistakes are td::Errors with the op name, not crashes.
TEST(LayerNorm, BadInputErrors) {
  Tensor x = zeros({2, 3, 4});
  EXPECT_THROW(layer_norm(x, {3}), Error);                             // not the trailing dims
  EXPECT_THROW(layer_norm(x, {2, 2, 3, 4}), Error);                    // more dims than x
  EXPECT_THROW(layer_norm(x, {}), Error);                              // empty
  EXPECT_THROW(layer_norm(x, {4}, zeros({3})), Error);                 // weight shape
  EXPECT_THROW(layer_norm(x, {4}, zeros({4}), zeros({4, 1})), Error);  // bias shape
  EXPECT_THROW(rms_norm(x, {3, 4}, zeros({12})), Error);
  EXPECT_THROW(rms_norm(arange(0, 4), {4}), Error);  // integer input
  EXPECT_THROW(
      layer_norm_backward(zeros({2, 4}), zeros({2, 4}), zeros({3}), zeros({2}), Tensor(), false, 4),
      Error);  // statistics of the wrong length
  try {
    layer_norm(x, {3, 5});
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_norm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 5]"), std::string::npos) << e.what();
  }
}

// A broadcast (stride-0) upstream gradient, as sum() produces: without weight, each
// layer_norm row sums to 0 whatever x is, so d(sum y)/dx = 0 (fp32 rounding: 1e-5).
TEST(LayerNorm, ExpandedUpstreamGradient) {
  Tensor x = randn_seeded({4, 10}, 19).set_requires_grad(true);
  sum(layer_norm(x, {10})).backward();
  for (float v : to_vector<float>(x.grad())) EXPECT_NEAR(v, 0.0f, 1e-5);
}
