// gelu (erf and tanh), silu and relu on CUDA against the CPU backend: forward, fused backward
// and autograd, sizes around the vector width, misaligned and non-contiguous inputs, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tardelli/autograd/engine.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

struct Act {
  const char* name;
  std::function<Tensor(const Tensor&)> fwd;
  std::function<Tensor(const Tensor&, const Tensor&)> bwd;  // (grad, x)
};

std::vector<Act> acts() {
  return {
      {"gelu", [](const Tensor& x) { return gelu(x); },
       [](const Tensor& g, const Tensor& x) { return gelu_backward(g, x, GeluApprox::None); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::Tanh); },
       [](const Tensor& g, const Tensor& x) { return gelu_backward(g, x, GeluApprox::Tanh); }},
      {"silu", [](const Tensor& x) { return silu(x); },
       [](const Tensor& g, const Tensor& x) { return silu_backward(g, x); }},
      {"relu", [](const Tensor& x) { return relu(x); },
       [](const Tensor& g, const Tensor& x) { return relu_backward(g, relu(x)); }},
  };
}

// Forward, the fused backward and autograd on both backends for x (CPU, any layout).
void check_act(const Act& a, const Tensor& x_cpu, uint64_t seed, const std::string& what_in) {
  const DType dt = x_cpu.dtype();
  const std::string what =
      std::string(a.name) + " " + name(dt) + " " + shape_str(x_cpu.sizes()) + " " + what_in;
  // Elementwise in fp32 on both sides; expf / erfcf (CUDA, <= 2 ulp) against the CPU's
  // vectorized exp and libm erfc (a few ulp): 1e-5 relative for fp32.
  Tensor xc = cpu_leaf(x_cpu), xg = gpu_leaf(x_cpu);
  Tensor yc = a.fwd(xc), yg = a.fwd(xg);
  expect_matches(yg, yc, tol(dt), what + " y");
  Tensor g = randn_seeded(x_cpu.sizes(), seed, dt);
  Tensor dc = autograd::grad({yc}, {xc}, {g})[0];
  Tensor dg = autograd::grad({yg}, {xg}, {g.to(gpu())})[0];
  expect_matches(dg, dc, tol(dt), what + " autograd dx");
  Tensor x_dev = x_cpu.to(gpu());
  if (!x_cpu.is_contiguous()) {  // keep the CUDA input strided too
    x_dev = transpose(transpose(x_cpu, 0, 1).contiguous().to(gpu()), 0, 1);
  }
  expect_matches(a.bwd(g.to(gpu()), x_dev), a.bwd(g, x_cpu), tol(dt), what + " backward");
}

TEST(ActivationCuda, MatchesCpuOnAwkwardSizes) {
  TD_REQUIRE_CUDA();
  uint64_t seed = 3000;
  for (const Act& a : acts()) {
    for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{1000}, int64_t{4096 * 3 + 5},
                        (int64_t{1} << 20) + 3}) {
        ++seed;
        check_act(a, randn_seeded({n}, seed, 3.0).to(dt), seed + 1, "");
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(ActivationCuda, MisalignedAndNonContiguousInputs) {
  TD_REQUIRE_CUDA();
  for (const Act& a : acts()) {
    // A view starting one element in: not 16-byte aligned, so the scalar path runs.
    Tensor base = randn_seeded({4101}, 31, 2.0);
    check_act(a, base.narrow(0, 1, 4099), 32, "misaligned");
    // Strided [33, 70] (a transpose), made contiguous by the op.
    Tensor xt = transpose(randn_seeded({70, 33}, 33, 2.0), 0, 1);
    ASSERT_FALSE(xt.is_contiguous());
    check_act(a, xt, 34, "transposed");
    check_act(a, randn_seeded({5, 6, 7}, 35).to(DType::BFloat16), 36, "3-d bf16");
  }
}

TEST(ActivationCuda, ExtremeValues) {
  TD_REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {-1e4f, -30.f, -10.f, -1e-6f, 0.f, 1e-6f, 10.f, 30.f, 1e4f, -inf, inf};
  Tensor x = from_vector<float>(v, {static_cast<int64_t>(v.size())});
  for (const Act& a : acts()) {
    const std::vector<double> c = doubles(a.fwd(x)), g = doubles(a.fwd(x.to(gpu())));
    for (size_t i = 0; i < c.size(); ++i) {
      if (std::isnan(c[i])) {
        EXPECT_TRUE(std::isnan(g[i])) << a.name << " " << v[i];
      } else if (std::isinf(c[i])) {
        EXPECT_EQ(g[i], c[i]) << a.name << " " << v[i];
      } else {
        EXPECT_NEAR(g[i], c[i], 1e-5 * (1.0 + std::fabs(c[i]))) << a.name << " " << v[i];
      }
    }
  }
  // relu keeps NaN (as torch).
  Tensor nan = full({3}, std::numeric_limits<double>::quiet_NaN(), {DType::Float32, gpu(), false});
  for (double r : doubles(relu(nan))) EXPECT_TRUE(std::isnan(r));
}

TEST(ActivationCuda, EmptyAndBadInputs) {
  TD_REQUIRE_CUDA();
  Tensor e = zeros({0, 3}, {DType::Float32, gpu()});
  EXPECT_EQ(gelu(e).sizes(), (Shape{0, 3}));
  EXPECT_EQ(silu_backward(e, e).sizes(), (Shape{0, 3}));
  Tensor x = randn_seeded({10}, 37).to(gpu());
  EXPECT_THROW(gelu_backward(randn_seeded({10}, 38), x, GeluApprox::None), Error);  // CPU grad
  EXPECT_THROW(silu_backward(randn_seeded({11}, 39).to(gpu()), x), Error);
  EXPECT_THROW(relu(zeros({4}, {DType::Int64, gpu()})), Error);
  // A gradient of another dtype is converted to x's.
  Tensor g16 = randn_seeded({10}, 40).to(DType::BFloat16);
  expect_matches(silu_backward(g16.to(gpu()), x), silu_backward(g16, x.to(kCPU)), 1e-5,
                 "bf16 grad");
}

}  // namespace
