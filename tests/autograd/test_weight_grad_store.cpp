// Deferred weight gradients (include/tardelli/autograd/weight_grad_store.h): backward_input
// followed by DeferredWeightGrads::run must leave exactly the .grad a plain backward leaves.
#include <gtest/gtest.h>

#include <cmath>

#include "tardelli/autograd/weight_grad_store.h"
#include "tardelli/tardelli.h"

using namespace td;

namespace {

std::vector<float> v(const Tensor& t) {
  return to_vector<float>(t);
}

// Parameters of a 2-layer MLP: y = linear(tanh(linear(x, W1, b1)), W2, b2).
struct Mlp {
  Tensor w1, b1, w2, b2;
  TensorList params() const { return {w1, b1, w2, b2}; }
};

Mlp make_mlp(uint64_t seed, int64_t in, int64_t hidden, int64_t out) {
  Generator gen(seed);
  Mlp m;
  m.w1 = randn({hidden, in}, {}, &gen).set_requires_grad(true);
  m.b1 = randn({hidden}, {}, &gen).set_requires_grad(true);
  m.w2 = randn({out, hidden}, {}, &gen).set_requires_grad(true);
  m.b2 = randn({out}, {}, &gen).set_requires_grad(true);
  return m;
}

// The same values in fresh leaves (separate .grad).
Mlp copy_mlp(const Mlp& m) {
  Mlp c;
  c.w1 = m.w1.detach().clone().set_requires_grad(true);
  c.b1 = m.b1.detach().clone().set_requires_grad(true);
  c.w2 = m.w2.detach().clone().set_requires_grad(true);
  c.b2 = m.b2.detach().clone().set_requires_grad(true);
  return c;
}

// A scalar loss with a non-uniform upstream gradient: sum(y * c).
Tensor mlp_loss(const Mlp& m, const Tensor& x, const Tensor& c) {
  Tensor h = tanh(linear(x, m.w1, m.b1));
  return sum(mul(linear(h, m.w2, m.b2), c));
}

// The input of the MLP as a NON-contiguous view (the transpose of a [in, rows] tensor).
Tensor transposed_input(uint64_t seed, int64_t rows, int64_t in) {
  Generator gen(seed);
  return randn({in, rows}, {}, &gen).t();
}

// Double-precision gradients of mlp_loss for a 2-D x [n, in] (straightforward loops).
struct RefGrads {
  std::vector<double> x, w1, b1, w2, b2;
};
RefGrads reference(const Mlp& m, const Tensor& xt, const Tensor& ct) {
  const int64_t n = xt.size(0), in = xt.size(1), hid = m.w1.size(0), out = m.w2.size(0);
  auto x = v(xt), c = v(ct), w1 = v(m.w1), b1 = v(m.b1), w2 = v(m.w2);
  RefGrads r{std::vector<double>(n * in, 0.0), std::vector<double>(hid * in, 0.0),
             std::vector<double>(hid, 0.0), std::vector<double>(out * hid, 0.0),
             std::vector<double>(out, 0.0)};
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> a(hid), da(hid, 0.0);
    for (int64_t j = 0; j < hid; ++j) {
      double s = b1[j];
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * w1[j * in + k];
      a[j] = std::tanh(s);
    }
    for (int64_t o = 0; o < out; ++o) {
      const double g = c[i * out + o];  // dL/dy
      r.b2[o] += g;
      for (int64_t j = 0; j < hid; ++j) {
        r.w2[o * hid + j] += g * a[j];
        da[j] += g * w2[o * hid + j];
      }
    }
    for (int64_t j = 0; j < hid; ++j) {
      const double dh = da[j] * (1.0 - a[j] * a[j]);
      r.b1[j] += dh;
      for (int64_t k = 0; k < in; ++k) {
        r.w1[j * in + k] += dh * x[i * in + k];
        r.x[i * in + k] += dh * w1[j * in + k];
      }
    }
  }
  return r;
}

void expect_near_ref(const Tensor& got, const std::vector<double>& ref, const char* what) {
  auto g = v(got);
  ASSERT_EQ(g.size(), ref.size()) << what;
  // fp32 with sums over at most 8 terms of O(1) values: 1e-5 relative + absolute is ~50 ulps.
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], ref[i], 1e-5 * (1.0 + std::abs(ref[i]))) << what << " [" << i << "]";
}

}  // namespace

// The input gradient is complete right after backward_input (a previous pipeline stage can be
// sent it), the GEMM weight gradients are not yet there (undefined .grad, no post-accumulate
// hook has fired), the cheap bias gradients are; run() then gives bitwise the .grad of a plain
// backward (the same GEMM on the same (dY, X)) for every parameter, firing each weight's
// post-accumulate hook exactly once; a second run() does nothing.
TEST(WeightGradStore, MatchesPlainBackwardExactly) {
  const int64_t rows = 6, in = 5, hid = 7, out = 3;
  Mlp plain = make_mlp(11, in, hid, out);
  Mlp split = copy_mlp(plain);
  Generator gen(12);
  Tensor c = randn({rows, out}, {}, &gen);
  Tensor x0 = transposed_input(13, rows, in);
  ASSERT_FALSE(x0.is_contiguous());
  Tensor xp = x0.detach().set_requires_grad(true);
  Tensor xs = x0.detach().set_requires_grad(true);

  mlp_loss(plain, xp, c).backward();

  int hook_w1 = 0, hook_w2 = 0;
  std::vector<float> w1_at_hook;
  split.w1.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    ++hook_w1;
    w1_at_hook = v(leaf.grad());
  });
  split.w2.register_post_accumulate_grad_hook([&](const Tensor&) { ++hook_w2; });

  Tensor loss = mlp_loss(split, xs, c);
  autograd::DeferredWeightGrads deferred = autograd::backward_input({loss}, {Tensor()});
  EXPECT_EQ(deferred.size(), 2u);  // one GEMM per linear layer
  ASSERT_TRUE(xs.grad().defined());
  EXPECT_EQ(v(xs.grad()), v(xp.grad()));
  EXPECT_FALSE(split.w1.grad().defined());
  EXPECT_FALSE(split.w2.grad().defined());
  EXPECT_EQ(hook_w1, 0);
  EXPECT_EQ(hook_w2, 0);
  ASSERT_TRUE(split.b1.grad().defined());
  ASSERT_TRUE(split.b2.grad().defined());
  EXPECT_EQ(v(split.b1.grad()), v(plain.b1.grad()));
  EXPECT_EQ(v(split.b2.grad()), v(plain.b2.grad()));

  deferred.run();
  EXPECT_TRUE(deferred.empty());
  EXPECT_EQ(hook_w1, 1);
  EXPECT_EQ(hook_w2, 1);
  const TensorList ps = plain.params(), ss = split.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_TRUE(ss[i].grad().defined()) << "param " << i;
    EXPECT_EQ(v(ss[i].grad()), v(ps[i].grad())) << "param " << i;
  }
  EXPECT_EQ(w1_at_hook, v(plain.w1.grad()));  // the hook saw the accumulated gradient

  // Running again is a no-op: nothing left to accumulate, no hook fires.
  deferred.run();
  EXPECT_EQ(hook_w1, 1);
  EXPECT_EQ(hook_w2, 1);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(v(ss[i].grad()), v(ps[i].grad()));

  // And both equal a double-precision reference (the split pass is not just equal, it's right).
  RefGrads r = reference(plain, x0.contiguous(), c);
  expect_near_ref(xs.grad(), r.x, "x");
  expect_near_ref(split.w1.grad(), r.w1, "w1");
  expect_near_ref(split.b1.grad(), r.b1, "b1");
  expect_near_ref(split.w2.grad(), r.w2, "w2");
  expect_near_ref(split.b2.grad(), r.b2, "b2");
}

// Deferred gradients accumulate into an existing .grad (gradient accumulation over the
// micro-batches of a pipeline step): two micro-batches, each backward_input + run, give the
// same .grad as two plain backwards. A 3-D input [batch, seq, in] as in a transformer.
TEST(WeightGradStore, AccumulatesOverMicrobatches) {
  const int64_t in = 4, hid = 6, out = 5;
  Mlp plain = make_mlp(21, in, hid, out);
  Mlp split = copy_mlp(plain);
  Generator gen(22);
  std::vector<autograd::DeferredWeightGrads> pending;
  for (int mb = 0; mb < 2; ++mb) {
    Tensor x = randn({2, 3, in}, {}, &gen);
    Tensor c = randn({2, 3, out}, {}, &gen);
    mlp_loss(plain, x, c).backward();
    pending.push_back(autograd::backward_input({mlp_loss(split, x, c)}, {Tensor()}));
  }
  // Both input passes ran before either weight pass (the zb order I I W W).
  EXPECT_FALSE(split.w1.grad().defined());
  for (auto& d : pending) d.run();
  const TensorList ps = plain.params(), ss = split.params();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(v(ss[i].grad()), v(ps[i].grad())) << i;
}

namespace {
// One bf16 step through a cast of an fp32 master weight `w`, used by `uses` linear layers (the
// second use reads the cast weight's first `out` columns).
Tensor cast_loss(const Tensor& w, const Tensor& xin, const Tensor& c, int uses) {
  const int64_t out = w.size(0);
  Tensor wb = to_dtype(w, DType::BFloat16);
  Tensor y = linear(xin, wb);
  if (uses == 2) y = linear(tanh(y), wb.narrow(1, 0, out));
  return sum(mul(to_dtype(y, DType::Float32), c));
}

// Runs cast_loss with a plain backward and with backward_input + run on copies of the same
// weight; checks the input gradient, the hooks and the deferral, returns both weight grads.
std::pair<std::vector<float>, std::vector<float>> cast_grads(int uses) {
  const int64_t rows = 8, in = 16, out = 8;
  Generator gen(31);
  Tensor master0 = randn({out, in}, {}, &gen);
  Tensor x = randn({rows, in}, {DType::BFloat16}, &gen);
  Tensor c = randn({rows, out}, {}, &gen);
  Tensor wp = master0.clone().set_requires_grad(true);
  Tensor ws = master0.clone().set_requires_grad(true);
  Tensor xp = x.detach().set_requires_grad(true);
  Tensor xs = x.detach().set_requires_grad(true);
  cast_loss(wp, xp, c, uses).backward();
  int hooks = 0;
  ws.register_post_accumulate_grad_hook([&](const Tensor&) { ++hooks; });
  auto d = autograd::backward_input({cast_loss(ws, xs, c, uses)}, {Tensor()});
  EXPECT_EQ(d.size(), static_cast<size_t>(uses));
  EXPECT_FALSE(ws.grad().defined());
  EXPECT_EQ(v(xs.grad()), v(xp.grad()));
  d.run();
  EXPECT_TRUE(ws.grad().defined());
  if (!ws.grad().defined()) return {};
  EXPECT_EQ(ws.grad().dtype(), DType::Float32);
  EXPECT_EQ(hooks, uses);  // one accumulation per deferred GEMM
  return {v(ws.grad()), v(wp.grad())};
}
}  // namespace

// A bf16 layer computing with a cast of an fp32 master weight (how GPT runs in bf16: each
// linear casts its own weight): the deferred dW (bf16) flows back through the to_dtype node into
// the fp32 leaf, hooks included. The computation is the plain backward's (the same bf16 GEMM,
// the same cast), so the fp32 .grad is bitwise equal.
TEST(WeightGradStore, ThroughDtypeCast) {
  auto [split, plain] = cast_grads(1);
  EXPECT_EQ(split, plain);
}

// One cast output used by two deferred GEMMs: both deferred closures backpropagate through the
// same ToCopyBackward node (the store retains the graph for that). The plain backward sums the
// two bf16 gradients before the cast (one bf16 rounding of the sum) while the deferred pass
// casts each and sums in fp32, so they agree to one bf16 rounding (2^-8 relative) of the larger
// magnitude.
TEST(WeightGradStore, ThroughSharedDtypeCast) {
  auto [split, plain] = cast_grads(2);
  ASSERT_EQ(split.size(), plain.size());
  float scale = 0;
  for (float g : plain) scale = std::max(scale, std::abs(g));
  for (size_t i = 0; i < split.size(); ++i)
    EXPECT_NEAR(split[i], plain[i], std::ldexp(1.0f, -8) * 2.0f * scale) << i;
}

// Deferring outside backward_input is a clear error, not a silent drop of the gradient.
TEST(WeightGradStore, DeferOutsideBackwardInputThrows) {
  Tensor w = ones({2, 2}).set_requires_grad(true);
  EXPECT_FALSE(autograd::deferring_weight_grads());
  EXPECT_THROW(autograd::defer_weight_grad(w, [] { return ones({2, 2}); }), Error);
  // A root that needs no grad fails like backward does, and leaves the thread not deferring.
  EXPECT_THROW(autograd::backward_input({ones({1})}, {Tensor()}), Error);
  EXPECT_FALSE(autograd::deferring_weight_grads());
}
