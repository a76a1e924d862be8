#include "tardelli/ops/elementwise.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "ops/elementwise_impl.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/view.h"

// Note [Saved outputs]: a backward lambda that needs the forward's output captures
// out.detach(): capturing `out` itself would make node -> out -> grad_fn -> node a cycle.

namespace td {

using autograd::needs_grad;
using autograd::record;
using ops::binary_map;
using ops::reduce_grad;
using ops::unary_float_map;
using ops::unary_map;

namespace {

DType arith_type(const Tensor& a, const Tensor& b, const char* op) {
  ops::check_defined(a, op, "input");
  ops::check_defined(b, op, "other");
  TD_CHECK(a.dtype() != DType::Bool && b.dtype() != DType::Bool, op,
           ": arithmetic on bool tensors is not supported (", describe(a), ", ", describe(b), ")");
  return promote_types(a.dtype(), b.dtype());
}

// The dtype an op that always computes in floating point uses: int and bool inputs widen to
// float32; float8 inputs are refused (Note [FP8 dtypes]).
DType float_type(DType t, const char* op) {
  TD_CHECK(!is_float8(t), op, ": unsupported dtype ", dtype_name(t),
           " (float8 tensors only convert and move: use .to() first)");
  return is_floating(t) ? t : DType::Float32;
}

// dtype for (tensor op python-scalar): the tensor's, or float32 for an integral tensor with a
// non-integral scalar.
DType scalar_result_type(const Tensor& a, double s, const char* op) {
  ops::check_defined(a, op, "input");
  TD_CHECK(a.dtype() != DType::Bool, op, ": arithmetic on bool tensors is not supported");
  ops::check_not_float8(a, op);
  if (!a.is_floating_point() && s != std::floor(s)) return DType::Float32;
  return a.dtype();
}

Tensor as_type(const Tensor& a, DType t) {
  return a.dtype() == t ? a : to_dtype(a, t);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  DType rt = arith_type(a, b, "add");
  float fa = static_cast<float>(alpha);
  Tensor out = alpha == 1.0 ? binary_map("add", a, b, rt, {ops::Ew::Add},
                                         [](auto x, auto y) { return x + y; })
                            : binary_map("add", a, b, rt, {ops::Ew::AddAlpha, alpha},
                                         [fa](auto x, auto y) { return x + fa * y; });
  if (needs_grad({a, b})) {
    record("AddBackward", {a, b}, {&out}, [a, b, alpha](const TensorList& g, const auto& need) {
      return TensorList{
          need[0] ? reduce_grad(g[0], a) : Tensor(),
          need[1] ? reduce_grad(alpha == 1.0 ? g[0] : mul(g[0], alpha), b) : Tensor()};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  return add(a, b, -alpha);
}

Tensor mul(const Tensor& a, const Tensor& b) {
  DType rt = arith_type(a, b, "mul");
  Tensor out = binary_map("mul", a, b, rt, {ops::Ew::Mul}, [](auto x, auto y) { return x * y; });
  if (needs_grad({a, b})) {
    record("MulBackward", {a, b}, {&out}, [a, b](const TensorList& g, const auto& need) {
      return TensorList{need[0] ? reduce_grad(mul(g[0], b), a) : Tensor(),
                        need[1] ? reduce_grad(mul(g[0], a), b) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  DType rt = float_type(arith_type(a, b, "div"), "div");
  Tensor out = binary_map("div", a, b, rt, {ops::Ew::Div}, [](auto x, auto y) { return x / y; });
  if (needs_grad({a, b})) {
    record("DivBackward", {a, b}, {&out},
           [a, b, y = out.detach()](const TensorList& g, const auto& need) {
             return TensorList{need[0] ? reduce_grad(div(g[0], b), a) : Tensor(),
                               need[1] ? reduce_grad(neg(div(mul(g[0], y), b)), b) : Tensor()};
           });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  DType rt = float_type(arith_type(a, b, "pow"), "pow");
  Tensor out =
      binary_map("pow", a, b, rt, {ops::Ew::Pow}, [](auto x, auto y) { return std::pow(x, y); });
  if (needs_grad({a, b})) {
    record("PowBackward", {a, b}, {&out},
           [a, b, y = out.detach()](const TensorList& g, const auto& need) {
             Tensor ga, gb;
             if (need[0]) ga = reduce_grad(mul(mul(g[0], b), pow(a, sub(b, 1.0))), a);
             if (need[1]) {
               // d/db a^b = a^b log a, taken as 0 where a == 0 (torch's convention).
               Tensor la = binary_map(
                   "pow_backward", a, y, y.dtype(), {ops::Ew::PowLogBackward}, [](auto x, auto) {
                     return x == decltype(x)(0) ? decltype(x)(0)
                                                : static_cast<decltype(x)>(std::log(x));
                   });
               gb = reduce_grad(mul(mul(g[0], y), la), b);
             }
             return TensorList{ga, gb};
           });
  }
  return out;
}

namespace {

// maximum/minimum: the gradient goes to the winner; ties split it evenly.
Tensor extremum(const char* op, const Tensor& a, const Tensor& b, bool is_max) {
  DType rt = arith_type(a, b, op);
  Tensor out = is_max ? binary_map(op, a, b, rt, {ops::Ew::Maximum},
                                   [](auto x, auto y) { return x >= y ? x : y; })
                      : binary_map(op, a, b, rt, {ops::Ew::Minimum},
                                   [](auto x, auto y) { return x <= y ? x : y; });
  if (needs_grad({a, b})) {
    record(is_max ? "MaximumBackward" : "MinimumBackward", {a, b}, {&out},
           [a, b, is_max](const TensorList& g, const auto& need) {
             DType t = g[0].dtype();
             auto share = [&](const Tensor& x, const Tensor& y) {
               Tensor w = binary_map("extremum_backward", x, y, t,
                                     {is_max ? ops::Ew::MaxBackward : ops::Ew::MinBackward},
                                     [is_max](auto u, auto v) {
                                       using V = decltype(u);
                                       if (u == v) return V(0.5);
                                       return (is_max ? u > v : u < v) ? V(1) : V(0);
                                     });
               return mul(g[0], w);
             };
             return TensorList{need[0] ? reduce_grad(share(a, b), a) : Tensor(),
                               need[1] ? reduce_grad(share(b, a), b) : Tensor()};
           });
  }
  return out;
}

}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  return extremum("maximum", a, b, true);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return extremum("minimum", a, b, false);
}

// ---- tensor (op) scalar: the scalar is applied in fp32, never rounded to the tensor dtype ----

namespace {

template <typename F>
Tensor scalar_map(const char* op, const Tensor& a, DType rt, ops::EwSpec spec, F f) {
  if (!ops::on_cuda_backend(a)) ops::check_cpu(a, op);
  Tensor in = as_type(a.detach(), rt);
  Tensor out = Tensor::empty(in.sizes(), rt, in.device());
#if TD_WITH_CUDA
  if (out.is_cuda()) {
    cuda_ops::ew_unary(op, spec, out, in);
    return out;
  }
#endif
  TD_DISPATCH_NUMERIC(rt, op, [&]<typename T>() { cpu::map<T, T>(out, f, {in}); });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, double s) {
  DType rt = scalar_result_type(a, s, "add");
  Tensor out = TD_DISPATCH_NUMERIC(rt, "add", [&]<typename T>() {
    auto v = static_cast<acc_t<T>>(s);
    return scalar_map("add", a, rt, {ops::Ew::AddScalar, s}, [v](auto x) { return x + v; });
  });
  if (needs_grad({a})) {
    record("AddBackward", {a}, {&out}, [dt = a.dtype()](const TensorList& g, const auto&) {
      return TensorList{as_type(g[0], dt)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, double s) {
  return add(a, -s);
}

Tensor mul(const Tensor& a, double s) {
  DType rt = scalar_result_type(a, s, "mul");
  Tensor out = TD_DISPATCH_NUMERIC(rt, "mul", [&]<typename T>() {
    auto v = static_cast<acc_t<T>>(s);
    return scalar_map("mul", a, rt, {ops::Ew::MulScalar, s}, [v](auto x) { return x * v; });
  });
  if (needs_grad({a})) {
    record("MulBackward", {a}, {&out}, [s, dt = a.dtype()](const TensorList& g, const auto&) {
      return TensorList{as_type(mul(g[0], s), dt)};
    });
  }
  return out;
}

Tensor div(const Tensor& a, double s) {
  ops::check_defined(a, "div", "input");
  DType rt = float_type(a.dtype(), "div");
  Tensor out = scalar_map("div", a, rt, {ops::Ew::DivScalar, s},
                          [v = static_cast<float>(s)](auto x) { return x / v; });
  if (needs_grad({a})) {
    record("DivBackward", {a}, {&out},
           [s](const TensorList& g, const auto&) { return TensorList{div(g[0], s)}; });
  }
  return out;
}

Tensor rsub(const Tensor& a, double s) {
  return add(neg(a), s);
}

Tensor rdiv(const Tensor& a, double s) {
  ops::check_defined(a, "rdiv", "input");
  DType rt = float_type(a.dtype(), "rdiv");
  Tensor out = scalar_map("rdiv", a, rt, {ops::Ew::RdivScalar, s},
                          [v = static_cast<float>(s)](auto x) { return v / x; });
  if (needs_grad({a})) {
    record("RdivBackward", {a}, {&out}, [a, y = out.detach()](const TensorList& g, const auto&) {
      return TensorList{neg(div(mul(g[0], y), a))};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, double e) {
  ops::check_defined(a, "pow", "input");
  DType rt = float_type(a.dtype(), "pow");
  float fe = static_cast<float>(e);
  Tensor out;
  if (e == 2.0) {
    out = scalar_map("pow", a, rt, {ops::Ew::Square}, [](auto x) { return x * x; });
  } else if (e == 0.5) {
    out = scalar_map("pow", a, rt, {ops::Ew::Sqrt}, [](auto x) { return std::sqrt(x); });
  } else {
    out =
        scalar_map("pow", a, rt, {ops::Ew::PowScalar, e}, [fe](auto x) { return std::pow(x, fe); });
  }
  if (needs_grad({a})) {
    record("PowBackward", {a}, {&out}, [a, e](const TensorList& g, const auto&) {
      if (e == 0.0) return TensorList{mul(g[0], 0.0)};
      return TensorList{mul(mul(g[0], pow(a, e - 1.0)), e)};
    });
  }
  return out;
}

Tensor rpow(const Tensor& a, double base) {
  ops::check_defined(a, "pow", "exponent");
  DType rt = float_type(a.dtype(), "pow");
  float fb = static_cast<float>(base);
  Tensor out = scalar_map("pow", a, rt, {ops::Ew::RpowScalar, base},
                          [fb](auto x) { return std::pow(fb, x); });
  if (needs_grad({a})) {
    record("PowBackward", {a}, {&out}, [base, y = out.detach()](const TensorList& g, const auto&) {
      return TensorList{mul(mul(g[0], y), std::log(base))};
    });
  }
  return out;
}

namespace {

// A clamp bound in the element's arithmetic type. For integers a missing bound (+-inf) or one
// beyond the type's range saturates: converting an out-of-range float to an integer is
// undefined (x86 gives INT_MIN, which made clamp(int_tensor, 0, None) return INT_MIN).
template <typename V>
V clamp_bound(float b) {
  if constexpr (std::is_integral_v<V>) {
    if (b <= static_cast<float>(std::numeric_limits<V>::min()))
      return std::numeric_limits<V>::min();
    if (b >= static_cast<float>(std::numeric_limits<V>::max()))
      return std::numeric_limits<V>::max();
  }
  return static_cast<V>(b);
}

}  // namespace

Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  ops::check_defined(a, "clamp", "input");
  float l = lo ? static_cast<float>(*lo) : -INFINITY, h = hi ? static_cast<float>(*hi) : INFINITY;
  Tensor out = scalar_map("clamp", a, a.dtype(), {ops::Ew::Clamp, l, h}, [l, h](auto x) {
    using V = decltype(x);
    const V vl = clamp_bound<V>(l), vh = clamp_bound<V>(h);
    return x < vl ? vl : (x > vh ? vh : x);
  });
  if (needs_grad({a})) {
    record("ClampBackward", {a}, {&out}, [a, l, h](const TensorList& g, const auto&) {
      return TensorList{binary_map("clamp_backward", g[0], a, g[0].dtype(),
                                   {ops::Ew::ClampBackward, l, h}, [l, h](auto gv, auto x) {
                                     using V = decltype(gv);
                                     return (x >= decltype(x)(l) && x <= decltype(x)(h)) ? gv
                                                                                         : V(0);
                                   })};
    });
  }
  return out;
}

// ---- unary math ----

#define TD_UNARY_OP(NAME, NODE, SPEC, FWD, BWD_BODY)                                      \
  Tensor NAME(const Tensor& a) {                                                          \
    Tensor out = unary_float_map(#NAME, a, {ops::Ew::SPEC}, FWD);                         \
    if (needs_grad({a})) {                                                                \
      record(NODE, {a}, {&out}, [a, y = out.detach()](const TensorList& g, const auto&) { \
        const Tensor& x = a;                                                              \
        (void)x;                                                                          \
        (void)y;                                                                          \
        return TensorList{BWD_BODY};                                                      \
      });                                                                                 \
    }                                                                                     \
    return out;                                                                           \
  }

TD_UNARY_OP(
    exp, "ExpBackward", Exp, [](auto v) { return std::exp(v); },
    binary_map("exp_backward", g[0], y, g[0].dtype(), {ops::Ew::Mul},
               [](auto gv, auto yv) { return gv * yv; }))
TD_UNARY_OP(
    log, "LogBackward", Log, [](auto v) { return std::log(v); },
    binary_map("log_backward", g[0], x, g[0].dtype(), {ops::Ew::Div},
               [](auto gv, auto xv) { return gv / xv; }))
TD_UNARY_OP(
    tanh, "TanhBackward", Tanh, [](auto v) { return std::tanh(v); },
    binary_map("tanh_backward", g[0], y, g[0].dtype(), {ops::Ew::TanhBackward},
               [](auto gv, auto yv) { return gv * (1 - yv * yv); }))
TD_UNARY_OP(
    sqrt, "SqrtBackward", Sqrt, [](auto v) { return std::sqrt(v); },
    binary_map("sqrt_backward", g[0], y, g[0].dtype(), {ops::Ew::SqrtBackward},
               [](auto gv, auto yv) { return gv / (2 * yv); }))
TD_UNARY_OP(
    rsqrt, "RsqrtBackward", Rsqrt, [](auto v) { return 1 / std::sqrt(v); },
    binary_map("rsqrt_backward", g[0], y, g[0].dtype(), {ops::Ew::RsqrtBackward},
               [](auto gv, auto yv) { return decltype(gv)(-0.5) * gv * yv * yv * yv; }))
TD_UNARY_OP(
    sigmoid, "SigmoidBackward", Sigmoid, [](auto v) { return 1 / (1 + std::exp(-v)); },
    binary_map("sigmoid_backward", g[0], y, g[0].dtype(), {ops::Ew::SigmoidBackward},
               [](auto gv, auto yv) { return gv * yv * (1 - yv); }))
TD_UNARY_OP(
    sin, "SinBackward", Sin, [](auto v) { return std::sin(v); },
    binary_map("sin_backward", g[0], x, g[0].dtype(), {ops::Ew::SinBackward},
               [](auto gv, auto xv) { return gv * std::cos(xv); }))
TD_UNARY_OP(
    cos, "CosBackward", Cos, [](auto v) { return std::cos(v); },
    binary_map("cos_backward", g[0], x, g[0].dtype(), {ops::Ew::CosBackward},
               [](auto gv, auto xv) { return -gv * std::sin(xv); }))
#undef TD_UNARY_OP

Tensor neg(const Tensor& a) {
  TD_CHECK(a.defined() && a.dtype() != DType::Bool, "neg: expected a numeric tensor, got ",
           describe(a));
  Tensor out = unary_map("neg", a, {ops::Ew::Neg}, [](auto v) { return -v; });
  if (needs_grad({a})) {
    record("NegBackward", {a}, {&out},
           [](const TensorList& g, const auto&) { return TensorList{neg(g[0])}; });
  }
  return out;
}

Tensor abs(const Tensor& a) {
  TD_CHECK(a.defined() && a.dtype() != DType::Bool, "abs: expected a numeric tensor, got ",
           describe(a));
  Tensor out = unary_map("abs", a, {ops::Ew::Abs}, [](auto v) { return v < 0 ? -v : v; });
  if (needs_grad({a})) {
    record("AbsBackward", {a}, {&out}, [a](const TensorList& g, const auto&) {
      return TensorList{binary_map("abs_backward", g[0], a, g[0].dtype(), {ops::Ew::AbsBackward},
                                   [](auto gv, auto xv) {
                                     using V = decltype(gv);
                                     return xv > 0 ? gv : (xv < 0 ? -gv : V(0));
                                   })};
    });
  }
  return out;
}

// ---- comparisons ----

namespace {

template <typename F>
Tensor compare(const char* op, const Tensor& a, const Tensor& b, ops::Ew code, F f) {
  ops::check_defined(a, op, "input");
  ops::check_defined(b, op, "other");
  ops::check_same_device(a, b, op);
  if (!ops::on_cuda_backend(a)) ops::check_cpu(a, op);
  DType ct = promote_types(a.dtype(), b.dtype());
  Tensor ac = as_type(a.detach(), ct), bc = as_type(b.detach(), ct);
  Tensor out = Tensor::empty(broadcast_shapes(a.sizes(), b.sizes(), op), DType::Bool, a.device());
#if TD_WITH_CUDA
  if (out.is_cuda()) {
    cuda_ops::ew_binary(op, {code}, out, ac, bc);
    return out;
  }
#endif
  TD_DISPATCH_ALL(ct, op, [&]<typename T>() { cpu::map<bool, T, T>(out, f, {ac, bc}); });
  return out;
}

Tensor scalar_like(const Tensor& a, double s) {
  DType t = (!a.is_floating_point() && s != std::floor(s)) ? DType::Float32 : a.dtype();
  if (t == DType::BFloat16 || t == DType::Float16) t = DType::Float32;  // compare exactly
  Tensor r = Tensor::empty({}, t, a.device());
  r.fill_(s);
  return r;
}

}  // namespace

#define TD_COMPARE(NAME, CODE, EXPR)                                                         \
  Tensor NAME(const Tensor& a, const Tensor& b) {                                            \
    return compare(#NAME, a, b, ops::Ew::CODE, [](auto x, auto y) -> bool { return EXPR; }); \
  }                                                                                          \
  Tensor NAME(const Tensor& a, double s) {                                                   \
    ops::check_defined(a, #NAME, "input");                                                   \
    return NAME(a, scalar_like(a, s));                                                       \
  }
TD_COMPARE(eq, Eq, x == y)
TD_COMPARE(ne, Ne, x != y)
TD_COMPARE(lt, Lt, x < y)
TD_COMPARE(le, Le, x <= y)
TD_COMPARE(gt, Gt, x > y)
TD_COMPARE(ge, Ge, x >= y)
#undef TD_COMPARE

Tensor logical_not(const Tensor& a) {
  ops::check_defined(a, "logical_not", "input");
  if (!ops::on_cuda_backend(a)) ops::check_cpu(a, "logical_not");
  Tensor out = Tensor::empty(a.sizes(), DType::Bool, a.device());
#if TD_WITH_CUDA
  if (out.is_cuda()) {
    cuda_ops::ew_unary("logical_not", {ops::Ew::LogicalNot}, out, a.detach());
    return out;
  }
#endif
  TD_DISPATCH_ALL(a.dtype(), "logical_not", [&]<typename T>() {
    cpu::map<bool, T>(out, [](auto x) -> bool { return !static_cast<bool>(x); }, {a});
  });
  return out;
}

// ---- in place ----

namespace {
void check_inplace(const Tensor& a, const char* op) {
  TD_CHECK(a.defined(), op, ": undefined tensor");
  TD_CHECK(!(autograd::grad_enabled() && a.requires_grad()), op,
           ": in-place update of a tensor that requires grad (", describe(a),
           ") is not tracked by autograd; wrap it in no_grad");
}
}  // namespace

Tensor& add_(Tensor& a, const Tensor& b, double alpha) {
  check_inplace(a, "add_");
  ops::check_same_device(a, b, "add_");
  if (!ops::on_cuda_backend(a)) ops::check_cpu(a, "add_");
  TD_CHECK(broadcast_shapes(a.sizes(), b.sizes(), "add_") == a.sizes(),
           "add_: ", shape_str(b.sizes()), " does not broadcast to the destination ",
           shape_str(a.sizes()));
  Tensor bc = as_type(b.detach(), a.dtype());
#if TD_WITH_CUDA
  if (a.is_cuda()) {
    cuda_ops::ew_binary("add_", {ops::Ew::AddInplace, alpha}, a, a, bc);
    return a;
  }
#endif
  float fa = static_cast<float>(alpha);
  TD_DISPATCH_NUMERIC(a.dtype(), "add_", [&]<typename T>() {
    cpu::map<T, T, T>(a, [fa](auto x, auto y) { return x + static_cast<decltype(x)>(fa) * y; },
                      {a, bc});
  });
  return a;
}

Tensor& mul_(Tensor& a, double s) {
  check_inplace(a, "mul_");
#if TD_WITH_CUDA
  if (a.is_cuda()) {
    cuda_ops::ew_unary("mul_", {ops::Ew::MulScalar, s}, a, a);
    return a;
  }
#endif
  ops::check_cpu(a, "mul_");
  TD_DISPATCH_NUMERIC(a.dtype(), "mul_", [&]<typename T>() {
    auto v = static_cast<acc_t<T>>(s);
    cpu::map<T, T>(a, [v](auto x) { return x * v; }, {a});
  });
  return a;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  TD_CHECK(lead >= 0, "sum_to: cannot reduce ", shape_str(grad.sizes()), " to ", shape_str(shape));
  Shape dims;
  for (int64_t i = 0; i < grad.dim(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && grad.size(i) != 1)) dims.push_back(i);
  }
  Tensor r = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return reshape(r, shape);
}

}  // namespace td
