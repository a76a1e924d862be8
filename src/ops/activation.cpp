#include "tardelli/ops/activation.h"

#include <cmath>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
// Plain declarations (the enum names the CUDA kernel); its functions are called, and defined,
// only in CUDA builds.
#include "ops/cuda/activation.h"
#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"

// Note [Activation numerics]: every activation is written in a form without cancellation, so
// fp32 results stay within a few ulp of the exact value over the whole range:
//   gelu (erf):  x * Phi(x) = 0.5 x erfc(-x / sqrt 2)     (1 + erf(z) cancels for z << 0)
//   gelu (tanh): 0.5 x (1 + tanh u) = x * sigmoid(2u),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   silu:        x * sigmoid(x)
// The backward kernels reuse the same sigmoid/erfc terms. Each op is one fused pass
// (cpu::map); bf16/f16 are loaded, computed in fp32 and rounded once on store.
// Note [Vectorized activations]: the sigmoid takes its exp from cpu::vexp (Note [Vectorized
// exp]), not std::exp, which has no vector form: with libm's scalar expf the tanh-GELU of a GPT-2
// MLP ran at ~6 ns/element and was ~8% of a train step. Kernels reach cpu::map as lambdas (a
// function pointer would not be inlined, and the loop would stay scalar).

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluCoeff = 0.044715f;

inline float sigmoid_f(float v) {
  return 1.0f / (1.0f + cpu::vexp(-v));
}

inline float gelu_erf(float x) {
  return 0.5f * x * std::erfc(-x * kInvSqrt2);
}
inline float gelu_erf_grad(float x) {
  return 0.5f * std::erfc(-x * kInvSqrt2) + x * kInvSqrt2Pi * std::exp(-0.5f * x * x);
}
inline float gelu_tanh(float x) {
  float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return x * sigmoid_f(2.0f * u);
}
// d/dx [x s(2u)] = s + x * (1 - tanh^2 u) / 2 * u' and 1 - tanh^2 u = 4 s (1 - s).
inline float gelu_tanh_grad(float x) {
  float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  float s = sigmoid_f(2.0f * u);
  float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

// y = gelu_tanh(x) and d = g * gelu_tanh'(x) over n contiguous elements: one sigmoid per element
// serves both (gelu = x s, gelu' = s + 2 x s (1 - s) u').
template <typename T>
void gelu_tanh_and_grad(const T* xp, const T* gp, T* yp, T* dp, int64_t n) {
  cpu::parallel_for(n, cpu::kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float v = static_cast<float>(xp[i]);
      const float u = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
      const float s = sigmoid_f(2.0f * u);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v * v);
      cpu::store(yp, i, v * s);
      cpu::store(dp, i, static_cast<float>(gp[i]) * (s + 2.0f * v * s * (1.0f - s) * du));
    }
  });
}

using cuda_ops::Activation;

void check_act_input(const Tensor& x, const char* op) {
  ops::check_defined(x, op, "input");
  ops::check_floating(x, op);
}

// out = f(x) in x's dtype.
template <typename F>
Tensor act_forward(const char* op, const Tensor& x, [[maybe_unused]] Activation act, F f) {
  check_act_input(x, op);
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::activation_forward(act, x);
#endif
  ops::check_cpu(x, op);
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    cpu::map<T, T>(out, [f](float v) { return f(v); }, {x});
  });
  return out;
}

// out = f(grad, x) in x's dtype; grad must have x's shape (converted to x's dtype if needed).
template <typename F>
Tensor act_backward(const char* op, const Tensor& grad, const Tensor& x,
                    [[maybe_unused]] Activation act, F f) {
  check_act_input(x, op);
  ops::check_defined(grad, op, "grad");
  ops::check_same_device(grad, x, op);
  TD_CHECK(grad.sizes() == x.sizes(), op, ": grad ", describe(grad), " does not match input ",
           describe(x));
  Tensor g = grad.dtype() == x.dtype() ? grad.detach() : to_dtype(grad.detach(), x.dtype());
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::activation_backward(act, g, x);
#endif
  ops::check_cpu(x, op);
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    cpu::map<T, T, T>(out, [f](float gv, float v) { return f(gv, v); }, {g, x.detach()});
  });
  return out;
}

}  // namespace

GeluApprox parse_gelu_approx(const std::string& s) {
  if (s == "none") return GeluApprox::None;
  if (s == "tanh") return GeluApprox::Tanh;
  TD_ERROR("gelu: approximate must be 'none' or 'tanh', got '", s, "'");
}

Tensor gelu(const Tensor& x, GeluApprox approx) {
  Tensor out =
      approx == GeluApprox::Tanh
          ? act_forward("gelu", x, Activation::GeluTanh, [](float v) { return gelu_tanh(v); })
          : act_forward("gelu", x, Activation::GeluErf, [](float v) { return gelu_erf(v); });
  if (needs_grad({x})) {
    record("GeluBackward", {x}, {&out}, [x, approx](const TensorList& g, const auto&) {
      return TensorList{gelu_backward(g[0], x, approx)};
    });
  }
  return out;
}

// Note [Fused backward kernels]: the *_backward functions are single fused passes and are not
// themselves differentiable (no double backward through activations).
Tensor gelu_backward(const Tensor& grad, const Tensor& x, GeluApprox approx) {
  if (approx == GeluApprox::Tanh) {
    return act_backward("gelu_backward", grad, x, Activation::GeluTanh,
                        [](float g, float v) { return g * gelu_tanh_grad(v); });
  }
  return act_backward("gelu_backward", grad, x, Activation::GeluErf,
                      [](float g, float v) { return g * gelu_erf_grad(v); });
}

std::pair<Tensor, Tensor> gelu_and_backward(const Tensor& grad, const Tensor& x,
                                            GeluApprox approx) {
  const char* op = "gelu_and_backward";
  check_act_input(x, op);
  ops::check_defined(grad, op, "grad");
  ops::check_same_device(grad, x, op);
  TD_CHECK(grad.sizes() == x.sizes(), op, ": grad ", describe(grad), " does not match input ",
           describe(x));
  const bool fused = x.is_cpu() && approx == GeluApprox::Tanh && x.is_contiguous() &&
                     grad.is_contiguous() && grad.dtype() == x.dtype();
  if (!fused) {
    autograd::NoGradGuard ng;
    return {gelu(x.detach(), approx), gelu_backward(grad, x, approx)};
  }
  Tensor y = Tensor::empty(x.sizes(), x.dtype(), x.device());
  Tensor dx = Tensor::empty(x.sizes(), x.dtype(), x.device());
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    gelu_tanh_and_grad<T>(static_cast<const T*>(x.data_ptr()),
                          static_cast<const T*>(grad.data_ptr()), static_cast<T*>(y.data_ptr()),
                          static_cast<T*>(dx.data_ptr()), x.numel());
  });
  return {y, dx};
}

Tensor silu(const Tensor& x) {
  Tensor out = act_forward("silu", x, Activation::Silu, [](float v) { return v * sigmoid_f(v); });
  if (needs_grad({x})) {
    record("SiluBackward", {x}, {&out},
           [x](const TensorList& g, const auto&) { return TensorList{silu_backward(g[0], x)}; });
  }
  return out;
}

Tensor silu_backward(const Tensor& grad, const Tensor& x) {
  return act_backward("silu_backward", grad, x, Activation::Silu, [](float g, float v) {
    float s = sigmoid_f(v);
    return g * s * (1.0f + v * (1.0f - s));
  });
}

Tensor relu(const Tensor& x) {
  // `v < 0 ? 0 : v` propagates NaN (a NaN input stays NaN, as in torch).
  Tensor out =
      act_forward("relu", x, Activation::Relu, [](float v) { return v < 0.0f ? 0.0f : v; });
  if (needs_grad({x})) {
    record("ReluBackward", {x}, {&out}, [y = out.detach()](const TensorList& g, const auto&) {
      return TensorList{relu_backward(g[0], y)};
    });
  }
  return out;
}

Tensor relu_backward(const Tensor& grad, const Tensor& y) {
  return act_backward("relu_backward", grad, y, Activation::Relu,
                      [](float g, float v) { return v > 0.0f ? g : 0.0f; });
}

}  // namespace td
