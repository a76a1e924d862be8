#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// torch.optim.AdamW, one element, in double:
//   p *= 1 - lr wd; m = m + (1 - b1)(g - m); v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// `round` models the storage of p (identity for fp32, bf16 rounding for bf16 params).
struct RefState {
  std::vector<double> p, m, v;
};

template <typename Round>
void ref_step(RefState& s, const std::vector<double>& g, const AdamWConfig& c, Round round) {
  double bc1 = 1 - std::pow(c.beta1, c.step), bc2 = 1 - std::pow(c.beta2, c.step);
  for (size_t i = 0; i < s.p.size(); ++i) {
    double p = s.p[i] * (1 - c.lr * c.weight_decay);
    s.m[i] += (1 - c.beta1) * (g[i] - s.m[i]);
    s.v[i] = c.beta2 * s.v[i] + (1 - c.beta2) * g[i] * g[i];
    p -= c.lr / bc1 * s.m[i] / (std::sqrt(s.v[i]) / std::sqrt(bc2) + c.eps);
    s.p[i] = round(p);
  }
}

}  // namespace

// Three fp32 steps (new gradients each step) match torch's AdamW formula in double. The
// kernel computes each step in fp32: relative error a few ulp of p per step -> 1e-6 absolute
// for O(1) params; moments 1e-5 relative (+1e-9 absolute for v ~ g^2 near 0).
TEST(AdamW, ThreeStepsMatchTorchFormula) {
  const int64_t n = 1000;
  Tensor p = randn_seeded({n}, 1), m = zeros({n}), v = zeros({n});
  AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  RefState ref{doubles(p), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (int64_t step = 1; step <= 3; ++step) {
    cfg.step = step;
    Tensor g = randn_seeded({n}, 10 + step, 0.1);
    adamw_step(p, g, m, v, cfg);
    ref_step(ref, doubles(g), cfg, [](double x) { return x; });
  }
  expect_close(doubles(p), ref.p, 1e-6, 1e-6, "param");
  expect_close(doubles(m), ref.m, 1e-9, 1e-5, "exp_avg");
  expect_close(doubles(v), ref.v, 1e-12, 1e-5, "exp_avg_sq");
  // The step moved the parameters (a test that cannot pass with a no-op kernel).
  Tensor p0 = randn_seeded({n}, 1);
  EXPECT_GT(std::fabs(doubles(p)[0] - doubles(p0)[0]), 1e-3);
}

// bf16 params (with bf16 and with fp32 grads): computed in fp32, rounded to bf16 once per step.
// The reference rounds p to bf16 after each double step, so the two agree except where fp32 vs
// double rounding lands on the other side of a bf16 tie: allow one bf16 ulp (2^-7 relative,
// 8-bit mantissa). lr = 0.05 makes each update several bf16 ulps, so a no-op would fail.
TEST(AdamW, BFloat16Params) {
  const int64_t n = 512;
  auto round_bf16 = [](double x) {
    return static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(x))));
  };
  for (DType gdt : {DType::BFloat16, DType::Float32}) {
    Tensor p = randn_seeded({n}, 2).to(DType::BFloat16), m = zeros({n}), v = zeros({n});
    RefState ref{doubles(p), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    AdamWConfig cfg;
    cfg.lr = 0.05;
    for (int64_t step = 1; step <= 3; ++step) {
      cfg.step = step;
      Tensor g = randn_seeded({n}, 20 + step).to(gdt);
      adamw_step(p, g, m, v, cfg);
      ref_step(ref, doubles(g), cfg, round_bf16);
    }
    EXPECT_EQ(p.dtype(), DType::BFloat16);
    expect_close(doubles(p), ref.p, 1e-6, 1.0 / 128, "bf16 param");
    expect_close(doubles(m), ref.m, 1e-7, 1e-5, "exp_avg");
  }
}

// The multi-tensor form equals the single-tensor form bit for bit, over tensors of mixed
// sizes (one spanning several 16K-element chunks) and dtypes.
TEST(AdamW, MultiTensorEqualsSingle) {
  AdamWConfig cfg;
  cfg.step = 4;
  TensorList ps = {randn_seeded({40000}, 3), randn_seeded({7, 3}, 4),
                   randn_seeded({100}, 5).to(DType::BFloat16)};
  TensorList gs = {randn_seeded({40000}, 6), randn_seeded({7, 3}, 7), randn_seeded({100}, 8)};
  TensorList ms, vs, ps2, ms2, vs2;
  for (size_t k = 0; k < ps.size(); ++k) {
    ms.push_back(mul(randn_seeded(ps[k].sizes(), 30 + k), 0.1));
    vs.push_back(mul(ps[k].to(DType::Float32), ps[k].to(DType::Float32)));
    ps2.push_back(ps[k].clone());
    ms2.push_back(ms[k].clone());
    vs2.push_back(vs[k].clone());
  }
  adamw_step(ps, gs, ms, vs, cfg);
  for (size_t k = 0; k < ps.size(); ++k) adamw_step(ps2[k], gs[k], ms2[k], vs2[k], cfg);
  for (size_t k = 0; k < ps.size(); ++k) {
    EXPECT_EQ(to_vector<float>(ps[k]), to_vector<float>(ps2[k])) << k;
    EXPECT_EQ(to_vector<float>(ms[k]), to_vector<float>(ms2[k])) << k;
    EXPECT_EQ(to_vector<float>(vs[k]), to_vector<float>(vs2[k])) << k;
  }
}

// Mismatched numel, wrong moment dtype, non-contiguous tensors, a grad dtype that is neither
// the param's nor fp32, mismatched lists and step 0 are td::Errors (nothing is updated).
TEST(AdamW, BadInputErrors) {
  Tensor p = zeros({4, 3}), g = zeros({4, 3}), m = zeros({4, 3}), v = zeros({4, 3});
  AdamWConfig cfg;
  Tensor g_short = zeros({11});
  EXPECT_THROW(adamw_step(p, g_short, m, v, cfg), Error);
  Tensor m_bf16 = zeros({4, 3}, {DType::BFloat16});
  EXPECT_THROW(adamw_step(p, g, m_bf16, v, cfg), Error);
  Tensor p_t = zeros({3, 4}).t();
  EXPECT_THROW(adamw_step(p_t, g, m, v, cfg), Error);
  Tensor pb = zeros({4, 3}, {DType::BFloat16});
  EXPECT_THROW(adamw_step(pb, zeros({4, 3}, {DType::Float16}), m, v, cfg), Error);
  Tensor pi = zeros({4, 3}, {DType::Int32});
  EXPECT_THROW(adamw_step(pi, g, m, v, cfg), Error);
  AdamWConfig bad = cfg;
  bad.step = 0;
  EXPECT_THROW(adamw_step(p, g, m, v, bad), Error);
  TensorList ps = {p, p}, gs = {g}, ms = {m, m}, vs = {v, v};
  EXPECT_THROW(adamw_step(ps, gs, ms, vs, cfg), Error);
  TensorList gs2 = {g, g_short};
  EXPECT_THROW(adamw_step(ps, gs2, ms, vs, cfg), Error);
  for (float x : to_vector<float>(p)) EXPECT_EQ(x, 0.0f);
}

// Note [Capturable AdamW]: the step count and learning rate as 0-dim tensors give the update of
// adamw_step with the same (step, lr), up to the float32 formation of the coefficients: each
// coefficient is within an ulp or two of make_coeffs's (relative ~2e-7), and over five steps the
// parameters stay within 1e-6 relative of the host-coefficient path. The step tensor counts the
// calls; bad lr / step tensors are errors.
TEST(AdamW, CapturableMatchesHostCoefficients) {
  TensorList ps = {randn_seeded({5000}, 40), randn_seeded({6, 4}, 41),
                   randn_seeded({64}, 42).to(DType::BFloat16)};
  TensorList ms, vs, ps2, ms2, vs2;
  for (size_t k = 0; k < ps.size(); ++k) {
    ms.push_back(zeros(ps[k].sizes()));
    vs.push_back(zeros(ps[k].sizes()));
    ps2.push_back(ps[k].clone());
    ms2.push_back(ms[k].clone());
    vs2.push_back(vs[k].clone());
  }
  Tensor step = zeros({}), lr = zeros({});
  for (int64_t t = 1; t <= 5; ++t) {
    TensorList gs;
    for (size_t k = 0; k < ps.size(); ++k)
      gs.push_back(randn_seeded(ps[k].sizes(), 50 + t * 7 + k));
    const double rate = t < 3 ? 3e-3 : 1e-3;  // a schedule: the tensor carries it
    lr.fill_(rate);
    adamw_step_capturable(ps, gs, ms, vs, lr, step, 0.9, 0.95, 1e-8, 0.1);
    adamw_step(ps2, gs, ms2, vs2, AdamWConfig{rate, 0.9, 0.95, 1e-8, 0.1, t});
    EXPECT_EQ(step.item_double(), static_cast<double>(t));
  }
  for (size_t k = 0; k < ps.size(); ++k) {
    const std::vector<double> a = doubles(ps[k]), b = doubles(ps2[k]);
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-3));
    }
    // bf16 parameters round each update to 8 bits: one bf16 ulp (2^-8) when the tiny
    // coefficient difference crosses a rounding boundary.
    EXPECT_LE(worst, ps[k].dtype() == DType::BFloat16 ? 1.0 / 256 : 1e-6) << k;
  }
  TensorList p1 = {zeros({3})}, g1 = {zeros({3})}, m1 = {zeros({3})}, v1 = {zeros({3})};
  Tensor step_i = zeros({}, {DType::Int64});
  EXPECT_THROW(adamw_step_capturable(p1, g1, m1, v1, lr, step_i, 0.9, 0.95, 1e-8, 0.1), Error);
  Tensor lr1 = zeros({1});
  EXPECT_THROW(adamw_step_capturable(p1, g1, m1, v1, lr1, step, 0.9, 0.95, 1e-8, 0.1), Error);
  EXPECT_THROW(adamw_step_capturable(p1, g1, m1, v1, lr, step, 1.5, 0.95, 1e-8, 0.1), Error);
}
