// Elementwise ops on CUDA against the CPU backend: unary, binary, tensor-scalar, comparisons,
// where, masked_fill, tril/triu, in-place forms, broadcasting, strided operands, gradients.
//
// Tolerances: +, -, *, /, sqrt, min/max, clamp, comparisons and selections round once per
// IEEE operation on both backends, so they are compared bitwise. The kernels never fuse a*b+c
// into an FMA, but g++ may (-ffp-contract=fast is its C++ default and -march=x86-64-v3 has FMA):
// the tests therefore use alpha = 0.5 (x + 0.5*y rounds the same fused or not), and formulas like
// 1 - y*y (tanh's gradient) get a tolerance. exp, log, tanh, sigmoid, sin, cos and pow use CUDA's
// expf/logf/... on the GPU and glibc's (possibly vectorized) ones on the CPU, a few ulp apart:
// fp32 is compared at 1e-6 relative (~8 ulp); gradients chaining several of them at 1e-5. For
// bf16/f16 results a few-ulp fp32 difference can flip the final rounding: 1e-2 relative (bf16
// has 8 significant bits, 2^-8 ~ 4e-3).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/error.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

double tol_for(DType dt, bool transcendental) {
  if (!transcendental) return 0.0;
  return dt == DType::Float32 ? 1e-6 : 1e-2;
}

// Inputs as a CPU tensor and the same values on the GPU, in three layouts: contiguous
// (vector path, odd length for a tail), transposed and sliced (strided path).
struct Case {
  std::string name;
  Tensor cpu, gpu;
};
std::vector<Case> layouts(const Tensor& base /* [37, 41] */) {
  Tensor g = base.to(gpu());
  return {{"contiguous", base, g},
          {"transposed", base.t(), g.t()},
          {"sliced", base.slice(1, 1, 41, 3), g.slice(1, 1, 41, 3)},
          {"row", base.select(0, 5), g.select(0, 5)}};
}

}  // namespace

TEST(ElementwiseCuda, UnaryOps) {
  TD_REQUIRE_CUDA();
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    bool transcendental, positive;
  };
  std::vector<Op> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }, false, false},
      {"abs", [](const Tensor& x) { return abs(x); }, false, false},
      {"exp", [](const Tensor& x) { return exp(x); }, true, false},
      {"log", [](const Tensor& x) { return log(x); }, true, true},
      {"tanh", [](const Tensor& x) { return tanh(x); }, true, false},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, false, true},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, false, true},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, true, false},
      {"sin", [](const Tensor& x) { return sin(x); }, true, false},
      {"cos", [](const Tensor& x) { return cos(x); }, true, false},
  };
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (const Op& op : ops) {
      Tensor base = mul(randn({37, 41}), 2.0);
      if (op.positive) base = add(abs(base), 0.01);
      for (const Case& c : layouts(base.to(dt))) {
        expect_same_values(op.f(c.cpu), op.f(c.gpu), tol_for(dt, op.transcendental),
                           std::string(op.name) + " " + dtype_name(dt) + " " + c.name);
      }
    }
  }
  // Integer inputs: neg/abs stay integral, math functions compute in float32.
  Tensor i = randint(-50, 50, {1001}, {DType::Int32, kCPU});
  expect_same_values(neg(i), neg(i.to(gpu())), 0, "neg int32");
  expect_same_values(abs(i.to(DType::Int64)), abs(i.to(DType::Int64).to(gpu())), 0, "abs int64");
  expect_same_values(exp(i), exp(i.to(gpu())), 1e-6, "exp int32");
  expect_same_values(logical_not(i), logical_not(i.to(gpu())), 0, "logical_not int32");
  Tensor f = randn({999});
  expect_same_values(logical_not(gt(f, 0.0)), logical_not(gt(f, 0.0).to(gpu())), 0,
                     "logical_not bool");
}

TEST(ElementwiseCuda, BinaryOpsBroadcastAndPromote) {
  TD_REQUIRE_CUDA();
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    bool transcendental, integral;
  };
  std::vector<Op> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, false, true},
      {"add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); }, false, true},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, false, true},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, false, true},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, false, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, false, true},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, false, true},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(abs(a), b); }, true, false},
  };
  // (a shape, b shape): same, broadcast both ways, scalar-like, 0-d, empty.
  std::vector<std::pair<Shape, Shape>> shapes = {{{37, 41}, {37, 41}}, {{37, 1}, {1, 41}},
                                                 {{5, 1, 7}, {3, 1}},  {{1}, {1003}},
                                                 {{}, {4, 4}},         {{0, 3}, {1, 3}}};
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64}) {
    for (const Op& op : ops) {
      if (!is_floating(dt) && !op.integral) continue;
      for (auto& [sa, sb] : shapes) {
        Tensor a = mul(randn(sa), 4.0).to(dt), b = add(mul(randn(sb), 4.0), 0.5).to(dt);
        if (!is_floating(dt)) b = add(abs(b), 1.0);  // no division by zero
        std::string what =
            std::string(op.name) + " " + dtype_name(dt) + " " + shape_str(sa) + " " + shape_str(sb);
        expect_same_values(op.f(a, b), op.f(a.to(gpu()), b.to(gpu())),
                           tol_for(dt, op.transcendental), what);
        expect_same_values(op.f(b, a), op.f(b.to(gpu()), a.to(gpu())),
                           tol_for(dt, op.transcendental), what + " swapped");
      }
    }
  }
  // Strided operands and type promotion (int32 + bf16 -> bf16, bf16 * f16 -> f32).
  Tensor base = randn({37, 41});
  for (const Case& c : layouts(base)) {
    Tensor other = randn({41});
    if (c.cpu.dim() == 2 && c.cpu.size(1) != 41) other = randn({c.cpu.size(1)});
    if (c.cpu.dim() == 1) other = randn({c.cpu.size(0)});
    expect_same_values(mul(c.cpu, other), mul(c.gpu, other.to(gpu())), 0, "mul " + c.name);
    Tensor ci = mul(c.cpu, 10.0).to(DType::Int32);
    Tensor gi = mul(c.gpu, 10.0).to(DType::Int32);
    expect_same_values(add(ci, other.to(DType::BFloat16)),
                       add(gi, other.to(DType::BFloat16).to(gpu())), 0,
                       "add int32 + bf16 " + c.name);
    expect_same_values(mul(c.cpu.to(DType::BFloat16), other.to(DType::Float16)),
                       mul(c.gpu.to(DType::BFloat16), other.to(DType::Float16).to(gpu())), 0,
                       "mul bf16 * f16 " + c.name);
  }
}

TEST(ElementwiseCuda, ScalarOpsAndClamp) {
  TD_REQUIRE_CUDA();
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64}) {
    Tensor base = mul(randn({37, 41}), 5.0).to(dt);
    for (const Case& c : layouts(base)) {
      std::string what = std::string(dtype_name(dt)) + " " + c.name;
      auto check = [&](const char* name, const std::function<Tensor(const Tensor&)>& f,
                       bool transcendental) {
        expect_same_values(f(c.cpu), f(c.gpu), tol_for(dt, transcendental),
                           std::string(name) + " " + what);
      };
      check(
          "add 3", [](const Tensor& x) { return add(x, 3.0); }, false);
      check(
          "add 0.25", [](const Tensor& x) { return add(x, 0.25); }, false);
      check(
          "sub 2", [](const Tensor& x) { return sub(x, 2.0); }, false);
      check(
          "rsub", [](const Tensor& x) { return rsub(x, 1.5); }, false);
      check(
          "mul -3", [](const Tensor& x) { return mul(x, -3.0); }, false);
      check(
          "mul 0.1", [](const Tensor& x) { return mul(x, 0.1); }, false);
      check(
          "div 7", [](const Tensor& x) { return div(x, 7.0); }, false);
      check(
          "rdiv", [](const Tensor& x) { return rdiv(add(abs(x), 1.0), 2.0); }, false);
      check(
          "pow 2", [](const Tensor& x) { return pow(x, 2.0); }, false);
      check(
          "pow 0.5", [](const Tensor& x) { return pow(abs(x), 0.5); }, false);
      check(
          "pow 1.7", [](const Tensor& x) { return pow(abs(x), 1.7); }, true);
      check(
          "rpow", [](const Tensor& x) { return rpow(div(x, 4.0), 1.3); }, true);
      check(
          "clamp", [](const Tensor& x) { return clamp(x, -2.0, 3.0); }, false);
      if (is_floating(dt)) {
        check(
            "clamp lo", [](const Tensor& x) { return clamp(x, -1.0, std::nullopt); }, false);
        check(
            "clamp hi", [](const Tensor& x) { return clamp(x, std::nullopt, 0.5); }, false);
      }
    }
  }
}

TEST(ElementwiseCuda, ComparisonsEveryDtype) {
  TD_REQUIRE_CUDA();
  using Cmp = Tensor (*)(const Tensor&, const Tensor&);
  using CmpS = Tensor (*)(const Tensor&, double);
  std::vector<std::pair<Cmp, CmpS>> ops = {{eq, eq}, {ne, ne}, {lt, lt},
                                           {le, le}, {gt, gt}, {ge, ge}};
  for (DType dt :
       {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64, DType::Bool}) {
    // Few distinct values so equality happens often.
    Tensor a = randint(-2, 3, {37, 41}, {DType::Int64, kCPU}).to(dt);
    Tensor b = randint(-2, 3, {41}, {DType::Int64, kCPU}).to(dt);
    for (size_t k = 0; k < ops.size(); ++k) {
      std::string what = std::string(dtype_name(dt)) + " op " + std::to_string(k);
      expect_same_values(ops[k].first(a, b), ops[k].first(a.to(gpu()), b.to(gpu())), 0, what);
      expect_same_values(ops[k].first(a.t(), b.unsqueeze(1)),
                         ops[k].first(a.to(gpu()).t(), b.to(gpu()).unsqueeze(1)), 0,
                         what + " strided");
      if (dt != DType::Bool) {
        expect_same_values(ops[k].second(a, 1.0), ops[k].second(a.to(gpu()), 1.0), 0,
                           what + " scalar");
        expect_same_values(ops[k].second(a, 0.5), ops[k].second(a.to(gpu()), 0.5), 0,
                           what + " 0.5");
      }
    }
  }
}

TEST(ElementwiseCuda, WhereMaskedFillTrilTriu) {
  TD_REQUIRE_CUDA();
  for (DType dt :
       {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64, DType::Bool}) {
    std::string name = dtype_name(dt);
    Tensor x = mul(randn({3, 37, 41}), 3.0).to(dt);
    Tensor y = mul(randn({37, 1}), 3.0).to(dt);
    Tensor cond = gt(randn({41}), 0.0);
    Tensor gx = x.to(gpu()), gy = y.to(gpu()), gc = cond.to(gpu());
    expect_same_values(where(cond, x, y), where(gc, gx, gy), 0, "where " + name);
    expect_same_values(where(cond.unsqueeze(1), x.transpose(1, 2), y.t()),
                       where(gc.unsqueeze(1), gx.transpose(1, 2), gy.t()), 0,
                       "where strided " + name);
    expect_same_values(masked_fill(x, cond, -7.5), masked_fill(gx, gc, -7.5), 0,
                       "masked_fill " + name);
    Tensor m2 = gt(randn({3, 41, 37}), 0.5);
    expect_same_values(masked_fill(x.transpose(1, 2), m2, 2.0),
                       masked_fill(gx.transpose(1, 2), m2.to(gpu()), 2.0), 0,
                       "masked_fill strided " + name);
    for (int64_t k : {-40, -3, 0, 1, 5, 50}) {
      expect_same_values(tril(x, k), tril(gx, k), 0, "tril " + name + " k=" + std::to_string(k));
      expect_same_values(triu(x, k), triu(gx, k), 0, "triu " + name + " k=" + std::to_string(k));
      expect_same_values(triu(x.transpose(1, 2), k), triu(gx.transpose(1, 2), k), 0,
                         "triu strided " + name);
    }
    expect_same_values(tril(x.narrow(1, 0, 0)), tril(gx.narrow(1, 0, 0)), 0, "tril empty " + name);
  }
  // where promotes (int32, float32 -> float32).
  Tensor a = randint(-5, 5, {10}, {DType::Int32, kCPU}), b = randn({10});
  Tensor c = gt(randn({10}), 0.0);
  expect_same_values(where(c, a, b), where(c.to(gpu()), a.to(gpu()), b.to(gpu())), 0,
                     "where promote");
}

TEST(ElementwiseCuda, InPlaceOnStridedViews) {
  TD_REQUIRE_CUDA();
  autograd::NoGradGuard ng;
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Int32}) {
    Tensor c = mul(randn({20, 30}), 4.0).to(dt), b = mul(randn({30}), 4.0).to(dt);
    Tensor g = c.to(gpu()), gb = b.to(gpu());
    Tensor cv = c.slice(0, 1, 20, 2), gv = g.slice(0, 1, 20, 2);
    add_(cv, b, 0.5);
    add_(gv, gb, 0.5);
    Tensor ct = c.t(), gt_ = g.t();
    mul_(ct, -1.5);
    mul_(gt_, -1.5);
    expect_same_values(c, g, 0, std::string("in place ") + dtype_name(dt));
  }
}

// Gradients of every differentiable op computed on CUDA match the CPU's (same formulas; the
// transcendental ones at the tolerance above).
TEST(ElementwiseCuda, Gradients) {
  TD_REQUIRE_CUDA();
  using F2 = std::function<Tensor(const Tensor&, const Tensor&)>;
  std::vector<std::pair<std::string, F2>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, add(abs(b), 0.5)); }},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(add(abs(a), 0.1), b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"unary",
       [](const Tensor& a, const Tensor& b) {
         Tensor p = add(abs(a), 0.2);
         return add(add(add(exp(a), log(p)), add(tanh(a), sqrt(p))),
                    add(add(rsqrt(p), sigmoid(b)), add(add(sin(a), cos(b)), abs(b))));
       }},
      {"scalar",
       [](const Tensor& a, const Tensor& b) {
         return add(add(mul(a, 3.0), div(b, 2.0)),
                    add(add(rdiv(add(abs(a), 1.0), 2.0), pow(a, 3.0)),
                        add(rpow(b, 1.5), clamp(a, -0.5, 0.7))));
       }},
      {"select",
       [](const Tensor& a, const Tensor& b) {
         Tensor m = gt(b, 0.3);
         return add(where(m, a, b), add(masked_fill(a, m, 2.0), add(tril(a, 1), triu(b, -2))));
       }},
  };
  for (auto& [name, f] : ops) {
    Tensor a = randn({9, 13}), b = randn({13});
    Tensor b2 = b.expand({9, 13}).contiguous();
    Tensor w = randn({9, 13});
    auto grads = [&](const Tensor& ai, const Tensor& bi) {
      Tensor x = ai.clone().set_requires_grad(true), y = bi.clone().set_requires_grad(true);
      sum(mul(f(x, y).to(kCPU), w)).backward();
      return std::make_pair(x.grad().to(kCPU), y.grad().to(kCPU));
    };
    const Tensor& bb = name == "select" ? b2 : b;  // tril/triu need 2-d operands
    auto [ca, cb] = grads(a, bb);
    auto [ga, gb] = grads(a.to(gpu()), bb.to(gpu()));
    double tol = (name == "unary" || name == "pow" || name == "scalar") ? 1e-5 : 0.0;
    // Broadcast gradients are summed by the reduction kernels (their order may differ).
    double tol_b = name == "select" ? tol : std::max(tol, 1e-5);
    expect_same_values(ca, ga, tol, name + " grad a");
    expect_same_values(cb, gb, tol_b, name + " grad b");
  }
}
