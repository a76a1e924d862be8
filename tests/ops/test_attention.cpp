// scaled_dot_product_attention, the fused (flash) kernels and the composite masked path against
// a double-precision reference written here: outputs, logsumexp and gradients, with GQA,
// causal masks (Tq == Tk and Tq < Tk, bottom-right aligned), non-contiguous inputs and bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::test::randn_seeded;

namespace {

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
};

// Attention in double over the logical values of q [B,H,Tq,D], k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv].
// `mask` (optional) is an additive [B,H,Tq,Tk] mask; causal is bottom-right aligned (query i
// sees keys j <= i + Tk - Tq). With `gout` also the gradients of sum(out * gout).
Ref ref_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                  const std::vector<double>* mask = nullptr, const Tensor* gout = nullptr) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Tk = k.size(2), Dv = v.size(3), G = H / Hkv;
  std::vector<float> Q = to_vector<float>(q), K = to_vector<float>(k), V = to_vector<float>(v);
  std::vector<float> GO = gout ? to_vector<float>(*gout) : std::vector<float>();
  Ref r;
  r.out.assign(B * H * Tq * Dv, 0.0);
  r.lse.assign(B * H * Tq, 0.0);
  r.dq.assign(Q.size(), 0.0);
  r.dk.assign(K.size(), 0.0);
  r.dv.assign(V.size(), 0.0);
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / G;
      auto qi = [&](int64_t t, int64_t d) { return ((b * H + h) * Tq + t) * D + d; };
      auto ki = [&](int64_t t, int64_t d) { return ((b * Hkv + hk) * Tk + t) * D + d; };
      auto vi = [&](int64_t t, int64_t d) { return ((b * Hkv + hk) * Tk + t) * Dv + d; };
      auto oi = [&](int64_t t, int64_t d) { return ((b * H + h) * Tq + t) * Dv + d; };
      for (int64_t i = 0; i < Tq; ++i) {
        std::vector<double> s(Tk), p(Tk);
        double mx = ninf;
        for (int64_t j = 0; j < Tk; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(Q[qi(i, d)]) * K[ki(j, d)];
          s[j] = acc * scale;
          if (mask) s[j] += (*mask)[((b * H + h) * Tq + i) * Tk + j];
          if (causal && j > i + Tk - Tq) s[j] = ninf;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < Tk; ++j) sum += (p[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < Tk; ++j) p[j] /= sum;
        r.lse[(b * H + h) * Tq + i] = mx + std::log(sum);
        for (int64_t j = 0; j < Tk; ++j) {
          for (int64_t d = 0; d < Dv; ++d) r.out[oi(i, d)] += p[j] * V[vi(j, d)];
        }
        if (!gout) continue;
        // dP = dO V^T; dS = P (dP - sum_j P dP); dQ = scale dS K; dK = scale dS^T Q; dV = P^T dO.
        std::vector<double> dp(Tk);
        double dot = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < Dv; ++d) acc += static_cast<double>(GO[oi(i, d)]) * V[vi(j, d)];
          dp[j] = acc;
          dot += p[j] * acc;
        }
        for (int64_t j = 0; j < Tk; ++j) {
          double ds = p[j] * (dp[j] - dot) * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qi(i, d)] += ds * K[ki(j, d)];
            r.dk[ki(j, d)] += ds * Q[qi(i, d)];
          }
          for (int64_t d = 0; d < Dv; ++d) r.dv[vi(j, d)] += p[j] * GO[oi(i, d)];
        }
      }
    }
  }
  return r;
}

// max |got - want| <= atol + rtol * max|want| (a norm-wise bound: reduced precision errors
// scale with the magnitude of the whole tensor, not of each element).
void expect_close(const Tensor& got, const std::vector<double>& want, double atol, double rtol,
                  const char* what) {
  std::vector<float> g = to_vector<float>(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  double mag = 0, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    mag = std::max(mag, std::fabs(want[i]));
    double e = std::fabs(g[i] - want[i]);
    if (e > err) {
      err = e;
      worst = i;
    }
  }
  EXPECT_LE(err, atol + rtol * mag)
      << what << ": worst at " << worst << " got " << g[worst] << " want " << want[worst];
}

struct Case {
  int64_t B, H, Hkv, Tq, Tk, D, Dv;
  bool causal;
};

// fp32 attention: scores and softmax are fp32 with fp32 accumulation over D and Tk terms of
// O(1) values, so 2e-5 absolute covers the rounding for these sizes (outputs are O(1)).
constexpr double kF32Tol = 2e-5;

}  // namespace

// Fused forward and backward equal the double reference, across block edges (T not a multiple
// of 64), GQA, causal with Tq == Tk and bottom-right causal with Tq < Tk, and Dv != D. The last
// two cases' heads exceed the hoisting budget of 2^17 floats, so they load each key block where
// it is used: 1300 * (2 D + Dv) = 156000 in the backward (Note [Attention backward operands]),
// 1700 * (D + Dv) = 136000 in the forward as well (Note [Attention forward tasks]).
TEST(Attention, FlashMatchesReference) {
  std::vector<Case> cases = {
      {2, 4, 2, 70, 70, 16, 16, false},   {2, 4, 2, 70, 70, 16, 16, true},
      {1, 3, 1, 37, 100, 8, 8, true},     {1, 2, 2, 130, 130, 32, 24, true},
      {1, 2, 1, 5, 140, 8, 8, false},     {1, 1, 1, 1, 1, 4, 4, true},
      {1, 2, 1, 300, 1300, 40, 40, true}, {1, 2, 1, 100, 1700, 40, 40, true},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " H" << c.H << " Hkv" << c.Hkv << " Tq" << c.Tq
                                    << " Tk" << c.Tk << " causal " << c.causal);
    Tensor q = randn_seeded({c.B, c.H, c.Tq, c.D}, seed++).set_requires_grad(true);
    Tensor k = randn_seeded({c.B, c.Hkv, c.Tk, c.D}, seed++).set_requires_grad(true);
    Tensor v = randn_seeded({c.B, c.Hkv, c.Tk, c.Dv}, seed++).set_requires_grad(true);
    Tensor g = randn_seeded({c.B, c.H, c.Tq, c.Dv}, seed++);
    double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    Ref r = ref_attention(q.detach(), k.detach(), v.detach(), c.causal, scale, nullptr, &g);
    AttentionForward f =
        flash_attention_forward(q.detach(), k.detach(), v.detach(), c.causal, scale);
    expect_close(f.out, r.out, kF32Tol, 0, "out");
    expect_close(f.lse, r.lse, kF32Tol, 1e-6, "lse");
    Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), c.causal);
    expect_close(out, r.out, kF32Tol, 0, "sdpa out");
    out.backward(g);
    expect_close(q.grad(), r.dq, 1e-4, 0, "dq");
    expect_close(k.grad(), r.dk, 1e-4, 0, "dk");
    expect_close(v.grad(), r.dv, 1e-4, 0, "dv");
  }
}

// Any input layout: q/k/v as [B, T, H, D] tensors transposed to [B, H, T, D], and a sliced
// head dim, give the reference values.
TEST(Attention, NonContiguousInputs) {
  Tensor q = randn_seeded({2, 50, 4, 16}, 200).transpose(1, 2);
  Tensor k = randn_seeded({2, 66, 2, 16}, 201).transpose(1, 2);
  Tensor v = randn_seeded({2, 66, 2, 40}, 202).transpose(1, 2).narrow(3, 5, 16);
  Tensor g = randn_seeded({2, 50, 4, 16}, 203).transpose(1, 2);
  double scale = 0.3;
  Ref r = ref_attention(q, k, v, true, scale, nullptr, &g);
  AttentionForward f = flash_attention_forward(q, k, v, true, scale);
  expect_close(f.out, r.out, kF32Tol, 0, "out");
  auto [dq, dk, dv] = flash_attention_backward(g, q, k, v, f.out, f.lse, true, scale);
  expect_close(dq, r.dq, 1e-4, 0, "dq");
  expect_close(dk, r.dk, 1e-4, 0, "dk");
  expect_close(dv, r.dv, 1e-4, 0, "dv");
}

// Gradients of the fused path agree with central differences (small sizes, fp32).
TEST(Attention, Gradcheck) {
  for (bool causal : {false, true}) {
    Tensor q = randn_seeded({1, 2, 5, 3}, 210).set_requires_grad(true);
    Tensor k = randn_seeded({1, 1, 6, 3}, 211).set_requires_grad(true);
    Tensor v = randn_seeded({1, 1, 6, 2}, 212).set_requires_grad(true);
    auto r = autograd::gradcheck(
        [causal](const TensorList& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), causal);
        },
        {q, k, v});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// The composite path (taken when a mask is given) with a bool mask equal to the causal mask
// matches the fused causal path in value and gradient; with Tq < Tk the mask is bottom-right.
TEST(Attention, CompositeMatchesFlash) {
  const int64_t B = 2, H = 4, Hkv = 2, Tq = 20, Tk = 29, D = 8;
  std::vector<bool> keep(Tq * Tk);
  for (int64_t i = 0; i < Tq; ++i) {
    for (int64_t j = 0; j < Tk; ++j) keep[i * Tk + j] = j <= i + Tk - Tq;
  }
  Tensor mask = from_vector<bool>(keep, {Tq, Tk});
  Tensor g = randn_seeded({B, H, Tq, D}, 223);
  TensorList grads[2];
  Tensor outs[2];
  for (int path = 0; path < 2; ++path) {
    Tensor q = randn_seeded({B, H, Tq, D}, 220).set_requires_grad(true);
    Tensor k = randn_seeded({B, Hkv, Tk, D}, 221).set_requires_grad(true);
    Tensor v = randn_seeded({B, Hkv, Tk, D}, 222).set_requires_grad(true);
    outs[path] = path == 0 ? scaled_dot_product_attention(q, k, v, mask)
                           : scaled_dot_product_attention(q, k, v, Tensor(), true);
    outs[path].backward(g);
    grads[path] = {q.grad(), k.grad(), v.grad()};
  }
  std::vector<float> o1 = to_vector<float>(outs[1]);
  expect_close(outs[0], std::vector<double>(o1.begin(), o1.end()), kF32Tol, 0, "out");
  for (int i = 0; i < 3; ++i) {
    std::vector<float> gf = to_vector<float>(grads[1][i]);
    expect_close(grads[0][i], std::vector<double>(gf.begin(), gf.end()), 1e-4, 0, "grad");
  }
}

// A float mask is added to the scaled scores; gradients through the composite path match the
// reference and finite differences.
TEST(Attention, FloatMask) {
  const int64_t B = 1, H = 2, T = 6, D = 4;
  Tensor mask = randn_seeded({1, 1, T, T}, 230);
  Tensor q = randn_seeded({B, H, T, D}, 231), k = randn_seeded({B, 1, T, D}, 232),
         v = randn_seeded({B, 1, T, D}, 233);
  std::vector<float> mv = to_vector<float>(mask);
  std::vector<double> full(B * H * T * T);
  for (size_t i = 0; i < full.size(); ++i) full[i] = mv[i % (T * T)];
  Ref r = ref_attention(q, k, v, false, 0.5, &full);
  expect_close(scaled_dot_product_attention(q, k, v, mask, false, 0.5), r.out, kF32Tol, 0, "out");
  auto res = autograd::gradcheck(
      [&](const TensorList& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], mask, false, 0.5);
      },
      {q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true)});
  EXPECT_TRUE(res.ok) << res.message;
}

// bf16 inputs: tiles are converted to fp32, so the error is the bf16 rounding of the output
// and of the saved O used in D = rowsum(dO * O) (relative 2^-8 each): 1.5% of the tensor's
// magnitude bounds both, against a reference on the same bf16-rounded inputs.
TEST(Attention, BFloat16) {
  const DType bf = DType::BFloat16;
  Tensor q = randn_seeded({1, 4, 90, 32}, 240, bf).set_requires_grad(true);
  Tensor k = randn_seeded({1, 2, 90, 32}, 241, bf).set_requires_grad(true);
  Tensor v = randn_seeded({1, 2, 90, 32}, 242, bf).set_requires_grad(true);
  Tensor g = randn_seeded({1, 4, 90, 32}, 243, bf);
  Ref r =
      ref_attention(q.detach(), k.detach(), v.detach(), true, 1.0 / std::sqrt(32.0), nullptr, &g);
  Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), true);
  EXPECT_EQ(out.dtype(), bf);
  expect_close(out, r.out, 1e-4, 0.015, "out");
  out.backward(g);
  EXPECT_EQ(q.grad().dtype(), bf);
  expect_close(q.grad(), r.dq, 1e-4, 0.015, "dq");
  expect_close(k.grad(), r.dk, 1e-4, 0.015, "dk");
  expect_close(v.grad(), r.dv, 1e-4, 0.015, "dv");
}

// The fused forward keeps memory O(T * D): tensors allocated during a T = 1024 forward stay far
// below the 4 MiB one fp32 T x T score matrix would take.
TEST(Attention, FlashDoesNotMaterializeScores) {
  const int64_t T = 1024, D = 32;
  Tensor q = randn_seeded({1, 1, T, D}, 250), k = randn_seeded({1, 1, T, D}, 251),
         v = randn_seeded({1, 1, T, D}, 252);
  reset_peak_memory_stats();
  int64_t before = memory_stats().current_bytes;
  AttentionForward f = flash_attention_forward(q, k, v, true, 0.2);
  int64_t used = memory_stats().peak_bytes - before;
  EXPECT_LT(used, T * T * 4 / 8);
  EXPECT_GE(used, T * D * 4);  // the output itself
}

// Two runs give bitwise identical gradients (fixed summation order per kv head).
TEST(Attention, BackwardIsDeterministic) {
  Tensor q = randn_seeded({2, 4, 100, 16}, 260), k = randn_seeded({2, 1, 100, 16}, 261);
  Tensor v = randn_seeded({2, 1, 100, 16}, 262), g = randn_seeded({2, 4, 100, 16}, 263);
  AttentionForward f = flash_attention_forward(q, k, v, true, 0.25);
  auto a = flash_attention_backward(g, q, k, v, f.out, f.lse, true, 0.25);
  auto b = flash_attention_backward(g, q, k, v, f.out, f.lse, true, 0.25);
  EXPECT_EQ(to_vector<float>(std::get<0>(a)), to_vector<float>(std::get<0>(b)));
  EXPECT_EQ(to_vector<float>(std::get<1>(a)), to_vector<float>(std::get<1>(b)));
  EXPECT_EQ(to_vector<float>(std::get<2>(a)), to_vector<float>(std::get<2>(b)));
}

// Bad shapes, dtypes and argument combinations raise td::Error.
TEST(Attention, BadInputIsAnError) {
  Tensor q = randn_seeded({1, 3, 4, 8}, 270), k = randn_seeded({1, 2, 4, 8}, 271),
         v = randn_seeded({1, 2, 4, 8}, 272);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v), Error);  // 3 heads vs 2 kv heads
  Tensor q2 = randn_seeded({1, 2, 4, 8}, 273);
  EXPECT_THROW(scaled_dot_product_attention(q2, randn_seeded({1, 2, 4, 7}, 274), v), Error);  // D
  EXPECT_THROW(scaled_dot_product_attention(q2, k, randn_seeded({1, 2, 5, 8}, 275)), Error);  // Tk
  EXPECT_THROW(scaled_dot_product_attention(q2.view({2, 4, 8}), k, v), Error);                // 3-D
  EXPECT_THROW(scaled_dot_product_attention(q2, k.to(DType::BFloat16), v), Error);  // dtype
  EXPECT_THROW(scaled_dot_product_attention(randn_seeded({1, 2, 6, 8}, 276), k, v, Tensor(), true),
               Error);  // causal with Tq > Tk
  Tensor m = from_vector<bool>(std::vector<bool>(16, true), {4, 4});
  EXPECT_THROW(scaled_dot_product_attention(q2, k, v, m, true), Error);  // mask and causal
  EXPECT_THROW(scaled_dot_product_attention(q2, k, v, from_vector<bool>({true, false}, {2})),
               Error);  // mask does not broadcast
  EXPECT_THROW(scaled_dot_product_attention(q2, k, v, randn_seeded({4, 4}, 277, DType::BFloat16)),
               Error);  // float mask of another dtype
  EXPECT_THROW(flash_attention_backward(q2, q2, k, v, q2, randn_seeded({1, 2, 3}, 278), false, 1.0),
               Error);  // lse shape
}

// Note [Attention output layout]: the fused CPU output is [B, H, T, D] over a [B, T, H, D]
// buffer, so the model's relayout for the output projection is a view of it, not a copy.
TEST(Attention, OutputIsLaidOutForTheProjection) {
  Tensor q = randn_seeded({2, 3, 20, 8}, 280), k = randn_seeded({2, 3, 20, 8}, 281),
         v = randn_seeded({2, 3, 20, 8}, 282);
  Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), true);
  EXPECT_EQ(y.sizes(), (Shape{2, 3, 20, 8}));
  Tensor proj_in = y.transpose(1, 2);
  EXPECT_TRUE(proj_in.is_contiguous());
  EXPECT_TRUE(proj_in.reshape({2, 20, 24}).shares_storage(y));
}
