// activation_linear (Note [Recomputed MLP activation]) must be the composition it replaces,
// linear(act(h), W, b) built from the separate ops, in value and in every gradient, while
// keeping only h for backward.
#include <gtest/gtest.h>

#include <cmath>

#include "tardelli/autograd/weight_grad_store.h"
#include "tardelli/tardelli.h"

using namespace td;

namespace {

double max_rel(const Tensor& a, const Tensor& b) {
  auto av = to_vector<float>(a.to(DType::Float32)), bv = to_vector<float>(b.to(DType::Float32));
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < av.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(av[i]) - bv[i]));
    den = std::max(den, std::fabs(static_cast<double>(bv[i])));
  }
  return num / den;
}

Tensor unfused(const Tensor& h, MlpActivation act, const Tensor& w, const Tensor& b) {
  if (act == MlpActivation::GeluTanh) return linear(gelu(h, GeluApprox::Tanh), w, b);
  const int64_t ff = h.size(-1) / 2;
  return linear(mul(silu(h.narrow(-1, 0, ff)), h.narrow(-1, ff, ff)), w, b);
}

struct Grads {
  Tensor y, dh, dw, db;
};

Grads run(bool fused, MlpActivation act, const Tensor& h0, const Tensor& w0, const Tensor& b0,
          const Tensor& gy) {
  Tensor h = h0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  Tensor b = b0.defined() ? b0.clone().set_requires_grad(true) : Tensor();
  Tensor y = fused ? activation_linear(h, act, w, b) : unfused(h, act, w, b);
  y.backward(gy);
  return {y.detach(), h.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

}  // namespace

// fp32: the fused op runs the same kernels on the same operands (the activation is recomputed
// bit for bit), so everything agrees to rounding-level (1e-6 relative, normwise), with and
// without a bias, for both activations, on a 3-D input with an odd token count.
TEST(ActivationLinear, MatchesUnfusedComposition) {
  Generator gen(11);
  for (MlpActivation act : {MlpActivation::GeluTanh, MlpActivation::SwiGLU}) {
    for (bool bias : {true, false}) {
      const int64_t in = 24, out = 10, k = act == MlpActivation::SwiGLU ? 2 * in : in;
      Tensor h = randn({3, 7, k}, {}, &gen), w = mul(randn({out, in}, {}, &gen), 0.2);
      Tensor b = bias ? randn({out}, {}, &gen) : Tensor();
      Tensor gy = randn({3, 7, out}, {}, &gen);
      Grads f = run(true, act, h, w, b, gy), u = run(false, act, h, w, b, gy);
      const char* name = act == MlpActivation::SwiGLU ? "swiglu" : "gelu";
      EXPECT_LT(max_rel(f.y, u.y), 1e-6) << name;
      EXPECT_LT(max_rel(f.dh, u.dh), 1e-6) << name;
      EXPECT_LT(max_rel(f.dw, u.dw), 1e-6) << name;
      if (bias) {
        EXPECT_LT(max_rel(f.db, u.db), 1e-6) << name;
      }
    }
  }
}

// bf16 operands: both paths round the activation and the products to bf16 the same way, so
// they agree within a couple of bf16 ulps (2^-8 relative each; 2e-2 normwise).
TEST(ActivationLinear, Bf16) {
  Generator gen(12);
  Tensor h = randn({16, 32}, {}, &gen).to(DType::BFloat16);
  Tensor w = mul(randn({8, 16}, {}, &gen), 0.3).to(DType::BFloat16);
  Tensor gy = randn({16, 8}, {}, &gen).to(DType::BFloat16);
  Grads f = run(true, MlpActivation::SwiGLU, h, w, Tensor(), gy);
  Grads u = run(false, MlpActivation::SwiGLU, h, w, Tensor(), gy);
  EXPECT_EQ(f.y.dtype(), DType::BFloat16);
  EXPECT_LT(max_rel(f.y, u.y), 2e-2);
  EXPECT_LT(max_rel(f.dh, u.dh), 2e-2);
  EXPECT_LT(max_rel(f.dw, u.dw), 2e-2);
}

// What backward keeps: after the forward, the fused op holds h and the output (the caller's),
// the unfused one also act(h) ([rows, ff] fp32 = 1 MiB here). The allocator's live bytes show
// the difference; the bound leaves room for size-class rounding but not for act(h).
TEST(ActivationLinear, DoesNotKeepTheActivation) {
  const int64_t rows = 1024, ff = 256, out = 64;
  Tensor h = randn({rows, ff}).set_requires_grad(true),
         w = randn({out, ff}).set_requires_grad(true);
  const int64_t act_bytes = rows * ff * 4;
  auto kept = [&](bool fused) {
    empty_cache();
    const int64_t base = memory_stats().current_bytes;
    Tensor y = fused ? activation_linear(h, MlpActivation::GeluTanh, w)
                     : unfused(h, MlpActivation::GeluTanh, w, Tensor());
    return memory_stats().current_bytes - base;
  };
  const int64_t fused = kept(true), plain = kept(false);
  EXPECT_LE(fused, rows * out * 4 + 4096) << "fused keeps " << fused << " bytes";
  EXPECT_GE(plain - fused, act_bytes) << "unfused " << plain << " vs fused " << fused;
}

// Note [SwiGLU backward memory]: the SwiGLU backward's peak above what exists before it (grad
// and h) is five [rows, ff] fp32 buffers: silu(gate), the two half gradients and their cat.
// Before, dm x up lived to the end of the cat: six. The bound leaves room for rounding only.
TEST(ActivationLinear, SwiGLUBackwardPeak) {
  const int64_t rows = 1024, ff = 256;
  Tensor h = randn({rows, 2 * ff}), grad = randn({rows, ff});
  const int64_t unit = rows * ff * 4;
  empty_cache();
  const int64_t base = memory_stats().current_bytes;
  reset_peak_memory_stats();
  auto [m, gh] = mlp_activation_and_backward(grad, h, MlpActivation::SwiGLU);
  const int64_t peak = memory_stats().peak_bytes - base;
  EXPECT_LE(peak, 5 * unit + 4096) << "peak " << peak << " bytes, unit " << unit;
  EXPECT_EQ(gh.size(-1), 2 * ff);
  EXPECT_EQ(m.size(-1), ff);
}

// mlp_activation, recorded op by op (GPT recompute none), takes gate and up from h through one
// split (Note [Split backward]), so h's gradient is formed once: [dgate | dup] written into one
// [rows, 2 ff] buffer. With two narrows, each piece's backward scattered into its own zero-filled
// [rows, 2 ff] tensor and the engine added the two: the backward's peak above the forward's state
// (h, grad, m and the saved silu(gate), which MulBackward frees) was 4 [rows, ff] fp32 units,
// now 3 (the split's buffer beside the two pieces' gradients). The bound leaves room for rounding
// only. The values are mlp_activation_and_backward's (the same ops on the same operands).
TEST(ActivationLinear, RecordedSwiGLUGradientFormedOnce) {
  const int64_t rows = 1024, ff = 256;
  const int64_t unit = rows * ff * 4;
  Tensor h0 = randn({rows, 2 * ff}), grad = randn({rows, ff});
  empty_cache();
  Tensor h = h0.clone().set_requires_grad(true);
  Tensor m = mlp_activation(h, MlpActivation::SwiGLU);
  const int64_t base = memory_stats().current_bytes;
  reset_peak_memory_stats();
  m.backward(grad);
  const int64_t peak = memory_stats().peak_bytes - base;
  EXPECT_LE(peak, 3 * unit + 4096) << "peak " << peak << " bytes, unit " << unit;
  auto [ref_m, ref_gh] = mlp_activation_and_backward(grad, h0, MlpActivation::SwiGLU);
  EXPECT_EQ(to_vector<float>(m.detach()), to_vector<float>(ref_m));
  EXPECT_EQ(to_vector<float>(h.grad()), to_vector<float>(ref_gh));
}

// Under deferred weight gradients (zero-bubble pipelines) the input pass leaves dW for later and
// the deferred closure recomputes the activation: the result equals a plain backward.
TEST(ActivationLinear, DeferredWeightGradient) {
  Generator gen(13);
  Tensor h0 = randn({9, 12}, {}, &gen), w0 = randn({5, 12}, {}, &gen), b0 = randn({5}, {}, &gen);
  Tensor gy = randn({9, 5}, {}, &gen);
  Grads ref = run(false, MlpActivation::GeluTanh, h0, w0, b0, gy);
  Tensor h = h0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  Tensor b = b0.clone().set_requires_grad(true);
  Tensor y = activation_linear(h, MlpActivation::GeluTanh, w, b);
  autograd::DeferredWeightGrads later = autograd::backward_input({y}, {gy});
  EXPECT_EQ(later.size(), 1u);
  EXPECT_FALSE(w.grad().defined());
  later.run();
  EXPECT_LT(max_rel(w.grad(), ref.dw), 1e-6);
  EXPECT_LT(max_rel(h.grad(), ref.dh), 1e-6);
  EXPECT_LT(max_rel(b.grad(), ref.db), 1e-6);
}

TEST(ActivationLinear, BadInputIsAnError) {
  Tensor w = randn({4, 6});
  EXPECT_THROW(activation_linear(randn({3, 7}), MlpActivation::GeluTanh, w), Error);
  EXPECT_THROW(activation_linear(randn({3, 6}), MlpActivation::SwiGLU, w), Error);  // needs 12
  EXPECT_NO_THROW(activation_linear(randn({3, 12}), MlpActivation::SwiGLU, w));
  EXPECT_THROW(activation_linear(randn({3, 6}), MlpActivation::GeluTanh, randn({4})), Error);
}
