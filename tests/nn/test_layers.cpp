// The td::nn layers: initialization as torch, forward against double references of the same
// math, gradients into the module's own parameters (gradcheck through the module), containers.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "tardelli/nn/nn.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double var_of(const std::vector<double>& v) {
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / static_cast<double>(v.size());
}

// y[r, o] = sum_i x[r, i] w[o, i] + b[o] in double, x given as rows of `in`.
std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& b, int64_t in, int64_t out) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  }
  return y;
}

}  // namespace

// Linear's initialization is torch's: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)). All
// values lie inside the bound, and over 16384 draws the mean (sd of estimate b/sqrt(3n) ~
// 0.0045 b) is within 0.03 b of 0 and the variance within 5% of b^2/3; the same seed gives the
// same weights, another seed different ones.
TEST(NNLinear, InitMatchesTorchBounds) {
  const int64_t in = 64, out = 256;
  Generator g1(7), g2(7), g3(8);
  nn::Linear a(in, out, true, &g1), b(in, out, true, &g2), c(in, out, true, &g3);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  std::vector<double> w = doubles(a.weight), bias = doubles(a.bias);
  for (double v : w) ASSERT_LE(std::fabs(v), bound);
  for (double v : bias) ASSERT_LE(std::fabs(v), bound);
  EXPECT_NEAR(mean_of(w), 0.0, 0.03 * bound);
  EXPECT_NEAR(var_of(w), bound * bound / 3, 0.05 * bound * bound / 3);
  EXPECT_EQ(to_vector<float>(a.weight), to_vector<float>(b.weight));
  EXPECT_EQ(to_vector<float>(a.bias), to_vector<float>(b.bias));
  EXPECT_NE(to_vector<float>(a.weight), to_vector<float>(c.weight));
  EXPECT_EQ(a.weight.sizes(), Shape({out, in}));
  EXPECT_TRUE(a.weight.requires_grad() && a.bias.requires_grad());
  nn::Linear nb(in, out, false, &g1);
  EXPECT_FALSE(nb.bias.defined());
  EXPECT_EQ(nb.named_parameters().size(), 1u);
}

// forward(x) = x W^T + b for 3-D, transposed (non-contiguous) and bias-free inputs, against
// the double reference: fp32 GEMM over K = 24 terms of O(1) products, error ~1e-6.
TEST(NNLinear, ForwardMatchesDoubleReference) {
  Generator gen(3);
  nn::Linear lin(24, 10, true, &gen);
  Tensor x = randn({2, 5, 24}, {}, &gen);
  expect_close(doubles(lin.forward(x)),
               ref_linear(doubles(x), doubles(lin.weight), doubles(lin.bias), 24, 10), 1e-5, 1e-5);
  Tensor xt = randn({24, 7}, {}, &gen).t();  // [7, 24], strides (1, 7)
  ASSERT_FALSE(xt.is_contiguous());
  expect_close(doubles(lin(xt)),
               ref_linear(doubles(xt.contiguous()), doubles(lin.weight), doubles(lin.bias), 24, 10),
               1e-5, 1e-5);
  nn::Linear nb(24, 10, false, &gen);
  expect_close(doubles(nb(x)), ref_linear(doubles(x), doubles(nb.weight), {}, 24, 10), 1e-5, 1e-5);
  EXPECT_THROW(lin.forward(randn({3, 23})), Error);
  EXPECT_THROW(nn::Linear(-1, 3), Error);
}

// Gradients reach the module's own weight and bias (central differences through forward).
TEST(NNLinear, Gradcheck) {
  Generator gen(4);
  nn::Linear lin(6, 4, true, &gen);
  Tensor x = randn({3, 6}, {}, &gen);
  x.set_requires_grad(true);
  auto r = autograd::gradcheck([&](const TensorList& in) { return lin.forward(in[0]); },
                               {x, lin.weight, lin.bias});
  EXPECT_TRUE(r.ok) << r.message;
}

// tie_weight shares the tensor (a write through one is seen by the other) and checks the shape.
TEST(NNLinear, TieWeight) {
  nn::Embedding emb(9, 4);
  nn::Linear head(4, 9, false);
  head.tie_weight(emb.weight);
  EXPECT_TRUE(head.weight.is_same(emb.weight));
  EXPECT_TRUE(head.named_parameters()[0].second.is_same(emb.weight));
  emb.weight.detach().fill_(0.5);
  EXPECT_EQ(to_vector<float>(head(ones({1, 4}))), std::vector<float>(9, 2.0f));
  EXPECT_THROW(head.tie_weight(zeros({4, 9})), Error);
}

// Embedding: weight ~ N(0, 1) (over 20000 draws, mean within 0.04 and variance within 5%:
// > 5 standard errors), forward gathers rows, out-of-range indices are a td::Error, and the
// gradient scatters into the weight.
TEST(NNEmbedding, InitForwardBackward) {
  Generator gen(5);
  nn::Embedding emb(1000, 20, &gen);
  std::vector<double> w = doubles(emb.weight);
  EXPECT_NEAR(mean_of(w), 0.0, 0.04);
  EXPECT_NEAR(var_of(w), 1.0, 0.05);
  Tensor idx = from_vector<int64_t>({3, 999, 3, 0}, {2, 2});
  Tensor y = emb(idx);
  ASSERT_EQ(y.sizes(), Shape({2, 2, 20}));
  std::vector<double> yv = doubles(y);
  const int64_t rows[] = {3, 999, 3, 0};
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 20; ++j) ASSERT_EQ(yv[r * 20 + j], w[rows[r] * 20 + j]);
  }
  sum(y).backward();
  std::vector<float> g = to_vector<float>(emb.weight.grad());
  EXPECT_EQ(g[3 * 20], 2.0f);
  EXPECT_EQ(g[999 * 20 + 5], 1.0f);
  EXPECT_EQ(g[1 * 20], 0.0f);
  EXPECT_THROW(emb(from_vector<int64_t>({1000}, {1})), Error);
  EXPECT_THROW(emb(from_vector<int64_t>({-1}, {1})), Error);
}

// LayerNorm: weight 1, bias 0 initially; with changed affine parameters forward matches the
// double reference (fp32 statistics over 16 elements: 1e-5); options control which parameters
// exist; gradients flow into weight and bias.
TEST(NNLayerNorm, ForwardParamsGradcheck) {
  nn::LayerNorm ln(16);
  EXPECT_EQ(to_vector<float>(ln.weight), std::vector<float>(16, 1.0f));
  EXPECT_EQ(to_vector<float>(ln.bias), std::vector<float>(16, 0.0f));
  Generator gen(6);
  ln.weight.detach().copy_(randn({16}, {}, &gen));
  ln.bias.detach().copy_(randn({16}, {}, &gen));
  Tensor x = randn({16, 5}, {}, &gen).t();  // non-contiguous [5, 16]
  std::vector<double> xv = doubles(x.contiguous()), w = doubles(ln.weight), b = doubles(ln.bias);
  std::vector<double> want(xv.size());
  for (int r = 0; r < 5; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 16; ++j) m += xv[r * 16 + j] / 16;
    for (int j = 0; j < 16; ++j) v += (xv[r * 16 + j] - m) * (xv[r * 16 + j] - m) / 16;
    for (int j = 0; j < 16; ++j) {
      want[r * 16 + j] = (xv[r * 16 + j] - m) / std::sqrt(v + 1e-5) * w[j] + b[j];
    }
  }
  expect_close(doubles(ln(x)), want, 1e-5, 1e-5);
  EXPECT_EQ(nn::LayerNorm(8, 1e-5, false).named_parameters().size(), 0u);
  nn::LayerNorm nobias(8, 1e-5, true, false);
  ASSERT_EQ(nobias.named_parameters().size(), 1u);
  EXPECT_EQ(nobias.named_parameters()[0].first, "weight");
  EXPECT_THROW(nn::LayerNorm(Shape{}), Error);

  nn::LayerNorm small(Shape{2, 3});
  Tensor xs = randn({4, 2, 3}, {}, &gen);
  xs.set_requires_grad(true);
  auto r = autograd::gradcheck([&](const TensorList& in) { return small(in[0]); },
                               {xs, small.weight, small.bias});
  EXPECT_TRUE(r.ok) << r.message;
}

// RMSNorm: without eps the default is torch's finfo(dtype).eps (2^-23 for fp32), visible on a
// tiny-magnitude row where eps dominates: x = 1e-4 gives mean(x^2) = 1e-8 vs 1.19e-7; an
// explicit eps is used as given.
TEST(NNRMSNorm, DefaultEpsAndForward) {
  nn::RMSNorm rms(4);
  ASSERT_EQ(rms.named_parameters().size(), 1u);
  Tensor x = full({2, 4}, 1e-4);
  const double want_default = 1e-4 / std::sqrt(1e-8 + std::ldexp(1.0, -23));
  expect_close(doubles(rms(x)), std::vector<double>(8, want_default), 0, 1e-5, "default eps");
  nn::RMSNorm rms2(4, 1e-6);
  expect_close(doubles(rms2(x)), std::vector<double>(8, 1e-4 / std::sqrt(1e-8 + 1e-6)), 0, 1e-5,
               "eps 1e-6");
  Generator gen(9);
  rms2.weight.detach().copy_(randn({4}, {}, &gen));
  Tensor y = randn({3, 4}, {}, &gen);
  std::vector<double> yv = doubles(y), w = doubles(rms2.weight), want(12);
  for (int r = 0; r < 3; ++r) {
    double ms = 0;
    for (int j = 0; j < 4; ++j) ms += yv[r * 4 + j] * yv[r * 4 + j] / 4;
    for (int j = 0; j < 4; ++j) want[r * 4 + j] = yv[r * 4 + j] / std::sqrt(ms + 1e-6) * w[j];
  }
  expect_close(doubles(rms2(y)), want, 1e-5, 1e-5, "weighted");
  y.set_requires_grad(true);
  auto r = autograd::gradcheck([&](const TensorList& in) { return rms2(in[0]); }, {y, rms2.weight});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(nn::RMSNorm(4, std::nullopt, false).named_parameters().size(), 0u);
}

// Dropout: in training about p of 100000 elements are zeroed (binomial sd 0.0016, allow 0.01)
// and the rest scaled by exactly 1/(1-p); in eval mode and for p = 0 it is the identity.
TEST(NNDropout, TrainingAndEval) {
  Generator gen(11);
  nn::Dropout d(0.3, &gen);
  Tensor x = ones({100000});
  std::vector<float> y = to_vector<float>(d(x));
  int64_t zeros_n = 0;
  for (float v : y) {
    if (v == 0.0f) {
      ++zeros_n;
    } else {
      ASSERT_FLOAT_EQ(v, static_cast<float>(1.0 / 0.7));
    }
  }
  EXPECT_NEAR(static_cast<double>(zeros_n) / 100000, 0.3, 0.01);
  d.eval();
  EXPECT_EQ(to_vector<float>(d(x)), to_vector<float>(x));
  nn::Dropout d0(0.0);
  EXPECT_EQ(to_vector<float>(d0(x)), to_vector<float>(x));
  EXPECT_THROW(nn::Dropout(1.5), Error);
  EXPECT_THROW(nn::Dropout(-0.1), Error);
}

// GELU in both forms against the formulas in double (fp32 evaluation: 1e-6 absolute).
TEST(NNGELU, BothFormsMatchFormula) {
  Tensor x = from_vector<float>({-3.0f, -1.0f, -0.1f, 0.0f, 0.5f, 2.0f}, {6});
  std::vector<double> xv = doubles(x), e(6), t(6);
  for (int i = 0; i < 6; ++i) {
    e[i] = 0.5 * xv[i] * (1 + std::erf(xv[i] / std::sqrt(2.0)));
    t[i] = 0.5 * xv[i] *
           (1 + std::tanh(std::sqrt(2.0 / M_PI) * (xv[i] + 0.044715 * xv[i] * xv[i] * xv[i])));
  }
  expect_close(doubles(nn::GELU()(x)), e, 1e-6, 1e-6, "erf");
  expect_close(doubles(nn::GELU("tanh")(x)), t, 1e-6, 1e-6, "tanh");
  EXPECT_GT(std::fabs(e[1] - t[1]), 1e-5);  // the two forms differ, so the test tells them apart
  EXPECT_THROW(nn::GELU("fast"), Error);
}

// ModuleList: children named "0", "1", ...; Python-style indexing; typed access; iteration.
TEST(NNModuleList, NamesIndexingIteration) {
  nn::ModuleList list;
  list.push_back(std::make_shared<nn::Linear>(2, 3));
  list.push_back(std::make_shared<nn::LayerNorm>(3));
  list.push_back(std::make_shared<nn::GELU>());
  EXPECT_EQ(list.size(), 3);
  std::vector<std::string> names;
  for (auto& [n, p] : list.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(list[-1]->type_name(), "GELU");
  EXPECT_EQ(list.at<nn::Linear>(0)->out_features(), 3);
  EXPECT_THROW(list.at<nn::Linear>(1), Error);
  EXPECT_THROW(list[3], Error);
  EXPECT_THROW(list[-4], Error);
  EXPECT_THROW(list.push_back(nullptr), Error);
  int count = 0;
  for (const auto& m : list) count += m != nullptr;
  EXPECT_EQ(count, 3);
}

// Sequential applies its modules in order (checked against calling them by hand), names its
// children "0", "1", ..., nests, and propagates eval() to its children.
TEST(NNSequential, ForwardIsComposition) {
  Generator gen(12);
  auto l1 = std::make_shared<nn::Linear>(5, 8, true, &gen);
  auto act = std::make_shared<nn::GELU>("tanh");
  auto l2 = std::make_shared<nn::Linear>(8, 3, true, &gen);
  auto drop = std::make_shared<nn::Dropout>(0.5, &gen);
  auto inner =
      std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{act, l2});
  nn::Sequential seq({l1, inner, drop});
  seq.eval();
  EXPECT_FALSE(drop->is_training());
  Tensor x = randn({4, 5}, {}, &gen);
  EXPECT_EQ(to_vector<float>(seq(x)), to_vector<float>(l2->forward(act->forward(l1->forward(x)))));
  std::vector<std::string> names;
  for (auto& [n, p] : seq.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.1.weight", "1.1.bias"}));
  EXPECT_EQ(seq.size(), 3);
  EXPECT_EQ(seq[1]->type_name(), "Sequential");
  EXPECT_THROW(seq[5], Error);
}
