#include <gtest/gtest.h>

#include <cmath>

#include "tardelli/tardelli.h"

using namespace td;

namespace {

std::vector<double> ref_binary(const Tensor& a, const Tensor& b, const Shape& out,
                               const std::function<double(double, double)>& f) {
  Tensor ae = a.expand(out).contiguous(), be = b.expand(out).contiguous();
  auto av = to_vector<float>(ae), bv = to_vector<float>(be);
  std::vector<double> r(av.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(av[i], bv[i]);
  return r;
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::fabs(got[i] - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

}  // namespace

// Binary ops broadcast like numpy, on contiguous, transposed and sliced operands, and match a
// double reference to fp32 rounding (one rounding: relative 2^-24 ~ 6e-8; 1e-6 leaves margin).
TEST(Elementwise, BroadcastAndStrides) {
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    std::function<double(double, double)> ref;
  };
  std::vector<Op> ops = {
      {"add", [](auto& a, auto& b) { return add(a, b); }, [](double x, double y) { return x + y; }},
      {"sub", [](auto& a, auto& b) { return sub(a, b); }, [](double x, double y) { return x - y; }},
      {"mul", [](auto& a, auto& b) { return mul(a, b); }, [](double x, double y) { return x * y; }},
      {"div", [](auto& a, auto& b) { return div(a, b); }, [](double x, double y) { return x / y; }},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); },
       [](double x, double y) { return std::max(x, y); }},
  };
  Tensor base = add(rand({5, 4, 6}), 0.5);
  std::vector<std::pair<Tensor, Tensor>> inputs = {
      {base, add(rand({5, 4, 6}), 0.5)},
      {base, add(rand({4, 1}), 0.5)},                     // broadcast
      {base.transpose(0, 2), add(rand({6, 1, 5}), 0.5)},  // non-contiguous + broadcast
      {base.slice(1, 0, 4, 2), add(rand({1, 2, 6}), 0.5).transpose(0, 1).transpose(0, 1)},
      {add(rand({1}), 0.5), base},  // scalar-like lhs
  };
  for (auto& op : ops) {
    for (auto& [a, b] : inputs) {
      Tensor out = op.f(a, b);
      Shape s = broadcast_shapes(a.sizes(), b.sizes(), "test");
      EXPECT_EQ(out.sizes(), s);
      EXPECT_LT(max_rel(to_vector<float>(out), ref_binary(a, b, s, op.ref)), 1e-6) << op.name;
    }
  }
}

// Gradients of broadcasting binary ops are summed back to each input's shape.
TEST(Elementwise, BroadcastGradients) {
  Tensor a = add(rand({3, 4}), 0.5).set_requires_grad(true);
  Tensor b = add(rand({4}), 0.5).set_requires_grad(true);
  for (auto f : std::vector<std::function<Tensor(const TensorList&)>>{
           [](const TensorList& in) { return add(in[0], in[1], 2.0); },
           [](const TensorList& in) { return mul(in[0], in[1]); },
           [](const TensorList& in) { return div(in[0], in[1]); },
           [](const TensorList& in) { return pow(in[0], in[1]); },
           [](const TensorList& in) { return maximum(in[0], in[1].transpose(0, 0)); },
       }) {
    auto r = autograd::gradcheck(f, {a, b});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(Elementwise, UnaryMathAndGradients) {
  Tensor x = add(rand({4, 5}), 0.25).set_requires_grad(true);
  std::vector<std::pair<std::function<Tensor(const Tensor&)>, std::function<double(double)>>> ops =
      {
          {[](auto& t) { return exp(t); }, [](double v) { return std::exp(v); }},
          {[](auto& t) { return log(t); }, [](double v) { return std::log(v); }},
          {[](auto& t) { return tanh(t); }, [](double v) { return std::tanh(v); }},
          {[](auto& t) { return sqrt(t); }, [](double v) { return std::sqrt(v); }},
          {[](auto& t) { return rsqrt(t); }, [](double v) { return 1 / std::sqrt(v); }},
          {[](auto& t) { return sigmoid(t); }, [](double v) { return 1 / (1 + std::exp(-v)); }},
          {[](auto& t) { return pow(t, 1.5); }, [](double v) { return std::pow(v, 1.5); }},
          {[](auto& t) { return rpow(t, 2.0); }, [](double v) { return std::pow(2.0, v); }},
          {[](auto& t) { return neg(t); }, [](double v) { return -v; }},
          {[](auto& t) { return rdiv(t, 3.0); }, [](double v) { return 3.0 / v; }},
      };
  auto xv = to_vector<float>(x);
  for (auto& [f, ref] : ops) {
    auto got = to_vector<float>(f(x.transpose(0, 1)).transpose(0, 1).contiguous());
    std::vector<double> want(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) want[i] = ref(xv[i]);
    EXPECT_LT(max_rel(got, want), 1e-6);
    auto r = autograd::gradcheck([&](const TensorList& in) { return f(in[0]); }, {x});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// bf16 computes in fp32 and rounds once: the result equals bf16(fp32 op on the bf16 inputs).
TEST(Elementwise, ReducedPrecisionRoundsOnce) {
  Tensor a = randn({1000}), b = randn({1000});
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Tensor ah = a.to(dt), bh = b.to(dt);
    Tensor got = mul(add(ah, bh), 1.0).to(DType::Float32);
    Tensor want = add(ah.to(DType::Float32), bh.to(DType::Float32)).to(dt).to(DType::Float32);
    EXPECT_EQ(to_vector<float>(got), to_vector<float>(want)) << dtype_name(dt);
    EXPECT_EQ(add(ah, bh).dtype(), dt);
  }
  // Scalars are applied in fp32, not rounded to bf16 first: 1 * 1.001 in bf16 is bf16(1.001).
  Tensor one = ones({1}, {DType::BFloat16});
  EXPECT_EQ(mul(one, 1.001).item<float>(), static_cast<float>(BFloat16(1.001f)));
}

TEST(Elementwise, TypePromotionAndComparisons) {
  Tensor i = from_vector<int64_t>({1, 2, 3}, {3});
  Tensor f = from_vector<float>({0.5, 2, 4}, {3});
  EXPECT_EQ(add(i, f).dtype(), DType::Float32);
  EXPECT_EQ(add(i, i).dtype(), DType::Int64);
  EXPECT_EQ(div(i, i).dtype(), DType::Float32);
  EXPECT_EQ(mul(i, 0.5).dtype(), DType::Float32);
  EXPECT_EQ(to_vector<float>(mul(i, 0.5)), (std::vector<float>{0.5, 1, 1.5}));
  Tensor c = gt(i, f);
  EXPECT_EQ(c.dtype(), DType::Bool);
  EXPECT_EQ(to_vector<int64_t>(c.to(DType::Int64)), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(to_vector<int64_t>(eq(f, 2.0).to(DType::Int64)), (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(to_vector<int64_t>(logical_not(eq(f, 2.0)).to(DType::Int64)),
            (std::vector<int64_t>{1, 0, 1}));
}

TEST(Elementwise, Errors) {
  EXPECT_THROW(add(ones({2, 3}), ones({4})), Error);
  EXPECT_THROW(add(ones({2}, {DType::Bool}), ones({2}, {DType::Bool})), Error);
  EXPECT_THROW(add(Tensor(), ones({2})), Error);
  try {
    mul(ones({2, 3}), ones({3, 2}));
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("mul"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[3, 2]"), std::string::npos) << m;
  }
}

// Large loops are split across threads; results do not depend on the split.
TEST(Elementwise, LargeParallelMatchesSerial) {
  Tensor a = randn({1 << 20}), b = randn({1 << 20});
  auto av = to_vector<float>(a), bv = to_vector<float>(b);
  auto got = to_vector<float>(mul(add(a, b), b));
  for (size_t i = 0; i < got.size(); i += 997) ASSERT_EQ(got[i], (av[i] + bv[i]) * bv[i]);
}

// clamp on integer tensors with one bound missing (or a bound beyond the type's range) leaves
// that side unbounded: the missing bound saturates to the type's limit instead of converting
// +-inf to an integer (undefined; INT_MIN on x86, which turned every element into INT_MIN).
TEST(Elementwise, IntegerClampWithOneBound) {
  for (DType dt : {DType::Int32, DType::Int64}) {
    Tensor x = from_vector<int64_t>({-7, -1, 0, 3, 100}, {5}).to(dt);
    EXPECT_EQ(to_vector<int64_t>(clamp(x, 0.0, std::nullopt)),
              (std::vector<int64_t>{0, 0, 0, 3, 100}));
    EXPECT_EQ(to_vector<int64_t>(clamp(x, std::nullopt, 2.0)),
              (std::vector<int64_t>{-7, -1, 0, 2, 2}));
    EXPECT_EQ(to_vector<int64_t>(clamp(x, -1e30, 1e30)), (std::vector<int64_t>{-7, -1, 0, 3, 100}));
  }
}
