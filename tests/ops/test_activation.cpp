#include <gtest/gtest.h>

#include <cmath>

#include "tardelli/tardelli.h"

using namespace td;

namespace {

double gelu_erf_ref(double x) {
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
}
double gelu_erf_grad_ref(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
double gelu_tanh_ref(double x) {
  double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_tanh_grad_ref(double x) {
  double k = std::sqrt(2.0 / M_PI);
  double u = k * (x + 0.044715 * x * x * x);
  double t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
double silu_ref(double x) {
  return x / (1.0 + std::exp(-x));
}
double silu_grad_ref(double x) {
  double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1 + x * (1 - s));
}

// Inputs covering the tails and the bend around 0: a uniform grid on [-6, 6] plus normals.
Tensor test_inputs() {
  std::vector<float> v;
  for (int i = 0; i <= 1200; ++i) v.push_back(-6.0f + 0.01f * static_cast<float>(i));
  Generator gen(7);
  for (float r : to_vector<float>(randn({800}, {}, &gen))) v.push_back(r);
  return from_vector<float>(v, {static_cast<int64_t>(v.size())});
}

// fp32 tolerance: 2e-6 relative (a few ulp: rounding x/sqrt2 or u to fp32 perturbs the
// argument by ~6e-8 relative, which the steep tails amplify up to ~2|z|^2 times) plus 1e-7
// absolute (one ulp of an O(1) value) for outputs that pass through ~0.
template <typename Ref>
void expect_close_to_ref(const Tensor& x, const Tensor& y, Ref ref, const char* what) {
  std::vector<float> xs = to_vector<float>(x), ys = to_vector<float>(y);
  ASSERT_EQ(xs.size(), ys.size());
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    double r = ref(static_cast<double>(xs[i]));
    double err = std::fabs(ys[i] - r);
    worst = std::max(worst, err / (std::fabs(r) + 1e-30));
    ASSERT_LE(err, 2e-6 * std::fabs(r) + 1e-7)
        << what << " at x=" << xs[i] << ": got " << ys[i] << " want " << r;
  }
  ::testing::Test::RecordProperty(std::string(what) + "_max_rel_err", std::to_string(worst));
}

}  // namespace

// Both gelu forms match double-precision references to fp32 accuracy, forward and backward.
TEST(Activation, GeluMatchesDoubleReference) {
  Tensor x = test_inputs();
  expect_close_to_ref(x, gelu(x, GeluApprox::None), gelu_erf_ref, "gelu_erf");
  expect_close_to_ref(x, gelu(x, GeluApprox::Tanh), gelu_tanh_ref, "gelu_tanh");
  Tensor ones_g = ones(x.sizes());
  expect_close_to_ref(x, gelu_backward(ones_g, x, GeluApprox::None), gelu_erf_grad_ref,
                      "gelu_erf_grad");
  expect_close_to_ref(x, gelu_backward(ones_g, x, GeluApprox::Tanh), gelu_tanh_grad_ref,
                      "gelu_tanh_grad");
}

// The two forms are different functions (max gap ~1e-3 near |x| ~ 2), so the test above
// cannot pass with the approx flag ignored.
TEST(Activation, GeluFormsDiffer) {
  Tensor x = from_vector<float>({-2.0f, 1.5f, 2.5f}, {3});
  auto a = to_vector<float>(gelu(x, GeluApprox::None));
  auto b = to_vector<float>(gelu(x, GeluApprox::Tanh));
  double gap = 0;
  for (size_t i = 0; i < a.size(); ++i)
    gap = std::max(gap, static_cast<double>(std::fabs(a[i] - b[i])));
  EXPECT_GT(gap, 1e-4);
}

TEST(Activation, SiluMatchesDoubleReference) {
  Tensor x = test_inputs();
  expect_close_to_ref(x, silu(x), silu_ref, "silu");
  expect_close_to_ref(x, silu_backward(ones(x.sizes()), x), silu_grad_ref, "silu_grad");
}

// relu zeroes negatives exactly, keeps positives bit-exact and propagates NaN; its backward
// passes the gradient where the output is positive.
TEST(Activation, Relu) {
  Tensor x = from_vector<float>({-3.0f, -0.0f, 0.0f, 0.5f, 7.25f, NAN}, {6});
  auto y = to_vector<float>(relu(x));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 0.5f);
  EXPECT_EQ(y[4], 7.25f);
  EXPECT_TRUE(std::isnan(y[5]));
  Tensor g = from_vector<float>({1, 2, 3, 4, 5, 6}, {6});
  auto gx = to_vector<float>(relu_backward(g, relu(x)));
  EXPECT_EQ(gx, (std::vector<float>{0, 0, 0, 4, 5, 0}));
}

// Autograd through each activation agrees with finite differences, on contiguous and
// transposed (non-contiguous) inputs. Relu inputs stay away from the kink at 0 by > eps.
TEST(Activation, Gradcheck) {
  Generator gen(3);
  Tensor a = randn({4, 5}, {}, &gen).set_requires_grad(true);
  Tensor bt = randn({5, 4}, {}, &gen).t().set_requires_grad(true);  // non-contiguous leaf
  ASSERT_FALSE(bt.is_contiguous());
  for (const Tensor& x : {a, bt}) {
    for (GeluApprox ap : {GeluApprox::None, GeluApprox::Tanh}) {
      auto r = autograd::gradcheck([ap](const TensorList& in) { return gelu(in[0], ap); }, {x});
      EXPECT_TRUE(r.ok) << r.message;
    }
    auto rs = autograd::gradcheck([](const TensorList& in) { return silu(in[0]); }, {x});
    EXPECT_TRUE(rs.ok) << rs.message;
  }
  Tensor xr =
      from_vector<float>({-1.5f, -0.2f, 0.3f, 2.0f, -0.7f, 0.9f}, {2, 3}).set_requires_grad(true);
  auto rr = autograd::gradcheck([](const TensorList& in) { return relu(in[0]); }, {xr});
  EXPECT_TRUE(rr.ok) << rr.message;
}

// bf16 computes in fp32 and rounds once: identical to the fp32 result of the same (bf16)
// inputs rounded to bf16. Forward and backward.
TEST(Activation, Bf16RoundsFp32Result) {
  Generator gen(11);
  Tensor xb = mul(randn({257}, {}, &gen), 3.0).to(DType::BFloat16);
  Tensor xf = xb.to(DType::Float32);
  for (GeluApprox ap : {GeluApprox::None, GeluApprox::Tanh}) {
    Tensor yb = gelu(xb, ap);
    EXPECT_EQ(yb.dtype(), DType::BFloat16);
    EXPECT_EQ(to_vector<float>(yb), to_vector<float>(gelu(xf, ap).to(DType::BFloat16)));
    Tensor gb = ones(xb.sizes()).to(DType::BFloat16);
    EXPECT_EQ(to_vector<float>(gelu_backward(gb, xb, ap)),
              to_vector<float>(gelu_backward(ones(xf.sizes()), xf, ap).to(DType::BFloat16)));
  }
  EXPECT_EQ(to_vector<float>(silu(xb)), to_vector<float>(silu(xf).to(DType::BFloat16)));
}

// Large inputs run multi-threaded and still match the single-element formula (checks the
// strided and the parallel path of the elementwise loop).
TEST(Activation, LargeAndStrided) {
  Generator gen(5);
  Tensor x = randn({300, 400}, {}, &gen);
  Tensor xt = x.t();
  Tensor y = gelu(xt, GeluApprox::Tanh);
  EXPECT_EQ(y.sizes(), (Shape{400, 300}));
  EXPECT_EQ(to_vector<float>(y), to_vector<float>(gelu(xt.contiguous(), GeluApprox::Tanh)));
  expect_close_to_ref(xt, y, gelu_tanh_ref, "gelu_tanh_large");
}

TEST(Activation, BadInputIsAnError) {
  EXPECT_THROW(parse_gelu_approx("fast"), Error);
  EXPECT_EQ(parse_gelu_approx("tanh"), GeluApprox::Tanh);
  EXPECT_EQ(parse_gelu_approx("none"), GeluApprox::None);
  Tensor xi = arange(0, 4);
  EXPECT_THROW(gelu(xi), Error);
  EXPECT_THROW(silu(xi), Error);
  EXPECT_THROW(relu(Tensor()), Error);
  EXPECT_THROW(gelu_backward(ones({3}), ones({4}), GeluApprox::None), Error);
  try {
    gelu(xi);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gelu"), std::string::npos) << e.what();
  }
}

// gelu_and_backward is gelu and gelu_backward in one pass: the same formulas, so the same values
// to fp32 rounding (1e-6 relative; FMA contraction may differ between the loops), for fp32 and
// bf16 (one rounding of the same fp32 value: at most one bf16 ulp, 2^-7 relative), and the
// plain ops on a non-contiguous input.
TEST(Activation, GeluAndBackwardMatchesSeparateOps) {
  Generator gen(41);
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor x = mul(randn({70001}, {}, &gen), 3.0).to(dt), g = randn({70001}, {}, &gen).to(dt);
    auto [y, dx] = gelu_and_backward(g, x, GeluApprox::Tanh);
    Tensor y_ref = gelu(x, GeluApprox::Tanh), dx_ref = gelu_backward(g, x, GeluApprox::Tanh);
    const double tol = dt == DType::Float32 ? 1e-6 : std::ldexp(1.0, -7);
    auto a = to_vector<float>(y.to(DType::Float32)), b = to_vector<float>(y_ref.to(DType::Float32));
    auto c = to_vector<float>(dx.to(DType::Float32)),
         d = to_vector<float>(dx_ref.to(DType::Float32));
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], tol * (std::fabs(b[i]) + 1e-3)) << dtype_name(dt) << " y " << i;
      ASSERT_NEAR(c[i], d[i], tol * (std::fabs(d[i]) + 1e-3)) << dtype_name(dt) << " dx " << i;
    }
  }
  Tensor xt = randn({40, 30}).t(), gt = randn({30, 40});
  auto [y2, dx2] = gelu_and_backward(gt, xt, GeluApprox::Tanh);
  EXPECT_EQ(sum(ne(y2, gelu(xt, GeluApprox::Tanh))).item<int64_t>(), 0);
  EXPECT_EQ(sum(ne(dx2, gelu_backward(gt, xt, GeluApprox::Tanh))).item<int64_t>(), 0);
  EXPECT_THROW(gelu_and_backward(randn({3}), randn({4}), GeluApprox::Tanh), Error);
}

namespace {

// Negative tails, where the outputs are tiny but still normal floats: gelu (tanh) down to
// x = -9.5 (~-7e-33), gelu (erf) to -12.5 (~-1e-34), silu to -80 (~-1e-33). Written so the
// results keep full relative precision there (Note [Activation numerics]), which the
// absolute floor of expect_close_to_ref hides; a cheaper exp that clamps or flushes early
// fails this.
Tensor tail_inputs(float lo, float hi) {
  std::vector<float> v;
  for (int i = 0; i <= 400; ++i) v.push_back(lo + (hi - lo) * static_cast<float>(i) / 400.0f);
  return from_vector<float>(v, {static_cast<int64_t>(v.size())});
}

// Relative error against the double reference with no absolute floor. The bound: fp32 rounding
// of the exponential's argument z (a few operations, ~2.4e-7 relative) becomes |z| times that
// relative error in exp(z), plus a few ulp for the rest.
template <typename Ref, typename Arg>
void expect_tail_close(const Tensor& x, const Tensor& y, Ref ref, Arg z_of, const char* what) {
  std::vector<float> xs = to_vector<float>(x), ys = to_vector<float>(y);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double r = ref(static_cast<double>(xs[i]));
    ASSERT_GT(std::fabs(r), 1e-37) << what << ": the input range leaves the normal floats";
    const double rtol = 2.4e-7 * std::fabs(z_of(static_cast<double>(xs[i]))) + 1e-6;
    ASSERT_LE(std::fabs(ys[i] - r), rtol * std::fabs(r))
        << what << " at x=" << xs[i] << ": got " << ys[i] << " want " << r;
  }
}

}  // namespace

TEST(Activation, NegativeTailsKeepRelativePrecision) {
  auto z_tanh = [](double x) {  // the sigmoid's argument 2u
    return 2.0 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  };
  // gelu_tanh_ref's 1 + tanh(u) cancels to 0 in double out here: the sigmoid form instead.
  auto gelu_tanh_tail = [&](double x) { return x / (1.0 + std::exp(-z_tanh(x))); };
  auto gelu_tanh_grad_tail = [&](double x) {
    const double s = 1.0 / (1.0 + std::exp(-z_tanh(x)));
    const double du = std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
    return s + 2.0 * x * s * (1.0 - s) * du;
  };
  auto z_erf = [](double x) { return 0.5 * x * x; };
  auto z_silu = [](double x) { return x; };
  Tensor xt = tail_inputs(-9.5f, -3.0f);
  expect_tail_close(xt, gelu(xt, GeluApprox::Tanh), gelu_tanh_tail, z_tanh, "gelu_tanh");
  // The fused backward's gradient is ~1e-30 at -9.5: covered from the same inputs.
  Tensor ones_g = ones(xt.sizes());
  auto [y, dx] = gelu_and_backward(ones_g, xt, GeluApprox::Tanh);
  expect_tail_close(xt, y, gelu_tanh_tail, z_tanh, "gelu_and_backward y");
  expect_tail_close(xt, dx, gelu_tanh_grad_tail, z_tanh, "gelu_and_backward dx");
  expect_tail_close(xt, gelu_backward(ones_g, xt, GeluApprox::Tanh), gelu_tanh_grad_tail, z_tanh,
                    "gelu_tanh_grad");
  Tensor xe = tail_inputs(-12.5f, -3.0f);
  expect_tail_close(xe, gelu(xe, GeluApprox::None), gelu_erf_ref, z_erf, "gelu_erf");
  expect_tail_close(xe, gelu_backward(ones(xe.sizes()), xe, GeluApprox::None), gelu_erf_grad_ref,
                    z_erf, "gelu_erf_grad");
  // Further out the exact results are below the smallest subnormal (gelu_tanh from x = -11,
  // gelu_erf from -15, silu from -120): each must give (-)0 or a subnormal there, not the ~1e-37
  // that an exponential clamped at exp(-87.3) would leave.
  auto far = [](float from) {
    return from_vector<float>({from, 2 * from, 100 * from, -1e30f}, {4});
  };
  const Tensor ft = far(-11.0f), fe = far(-15.0f), fs = far(-120.0f);
  for (const Tensor& y : {gelu(ft, GeluApprox::Tanh), gelu(fe, GeluApprox::None), silu(fs),
                          gelu_and_backward(ones(ft.sizes()), ft, GeluApprox::Tanh).first}) {
    for (float v : to_vector<float>(y)) EXPECT_LE(std::fabs(v), 1e-40f) << v;
  }
  Tensor xs = tail_inputs(-80.0f, -3.0f);
  expect_tail_close(xs, silu(xs), silu_ref, z_silu, "silu");
  expect_tail_close(xs, silu_backward(ones(xs.sizes()), xs), silu_grad_ref, z_silu, "silu_grad");
}
