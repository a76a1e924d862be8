#pragma once
// Helpers shared by the CUDA test suites (tests/ops/cuda, tests/models/cuda): the skip without a
// device, moving tensors between the backends, dtype lists and tolerances, and comparisons of a
// CUDA result against the CPU backend's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

// Skips the current test (returning from the function it is used in) when there is no CUDA
// device. The message is what the GPU run's scripts look for.
#define TD_REQUIRE_CUDA() \
  if (!td::cuda_available()) GTEST_SKIP() << "no CUDA device"

namespace td::test {

inline Device gpu() {
  return cuda_device(0);
}
inline Tensor on_cuda(const Tensor& t) {
  return t.to(cuda_device());
}
inline Tensor on_cpu(const Tensor& t) {
  return t.to(kCPU);
}

// Every dtype.
inline constexpr DType kAll[] = {DType::Float32, DType::BFloat16, DType::Float16,
                                 DType::Int32,   DType::Int64,    DType::Bool};

inline std::string name(DType dt) {
  return std::string(dtype_name(dt));
}

// Tolerance (relative to max(|want|, |want[i]|)) for results computed in fp32 on both backends
// and rounded once: fp32 1e-5 (the CPU sums rows in an 8-lane SIMD order, the GPU in block
// trees, so the fp32 sums differ in the last bits); bf16 1e-2 and fp16 2e-3 (an 8-bit / 11-bit
// mantissa: an ulp is 3.9e-3 / 4.9e-4, and two fp32 values a hair apart can round one ulp
// apart).
inline double tol(DType dt) {
  return dt == DType::BFloat16 ? 1e-2 : dt == DType::Float16 ? 2e-3 : 1e-5;
}

// got (on the GPU) matches want (CPU): same sizes and dtype, |got - want| <= rtol * (|want| +
// max |want|) elementwise, NaN where want is NaN.
inline void expect_matches(const Tensor& got, const Tensor& want, double rtol,
                           const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(want.defined()) << what;
  EXPECT_TRUE(got.is_cuda()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = doubles(got), w = doubles(want);
  double scale = 0.0;
  for (double v : w) {
    if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
  }
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      ASSERT_TRUE(std::isnan(g[i])) << what << " element " << i << ": got " << g[i];
      continue;
    }
    ASSERT_LE(std::fabs(g[i] - w[i]), rtol * (std::fabs(w[i]) + scale))
        << what << " element " << i << ": got " << g[i] << ", want " << w[i];
  }
}

// A detached copy of cpu on the GPU (gpu_leaf) or the CPU (cpu_leaf) that requires grad.
inline Tensor gpu_leaf(const Tensor& cpu) {
  Tensor t = cpu.detach().to(gpu());
  t.set_requires_grad(true);
  return t;
}
inline Tensor cpu_leaf(const Tensor& cpu) {
  Tensor t = cpu.detach().clone();
  t.set_requires_grad(true);
  return t;
}

// Random CPU values of dtype dt: standard normal floats, integers in [-1000, 1000), booleans
// from the sign of a normal value.
inline Tensor random_input(const Shape& s, DType dt, uint64_t seed) {
  Generator gen(seed);
  if (dt == DType::Bool) return gt(randn(s, {}, &gen), 0.0);
  if (is_integral(dt)) return randint(-1000, 1000, s, {dt, kCPU, false}, &gen);
  Tensor t = randn(s, {}, &gen);
  return dt == DType::Float32 ? t : t.to(dt);
}

// The bits of f, for bitwise comparisons of floats.
inline uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// A CUDA result (moved back) against the CPU's: same dtype and shape; floats within rtol
// (relative, plus rtol * 1e-3 absolute; infinities exact), bitwise when rtol == 0; a NaN only
// has to match a NaN; integers exact.
inline void expect_same_values(const Tensor& want, const Tensor& got_any, double rtol,
                               const std::string& what) {
  Tensor got = got_any.to(kCPU);
  ASSERT_EQ(want.dtype(), got.dtype()) << what;
  ASSERT_EQ(want.sizes(), got.sizes()) << what;
  if (is_floating(want.dtype())) {
    auto w = to_vector<float>(want), g = to_vector<float>(got);
    for (size_t i = 0; i < w.size(); ++i) {
      if (std::isnan(w[i]) || std::isnan(g[i])) {
        ASSERT_TRUE(std::isnan(w[i]) && std::isnan(g[i]))
            << what << " at " << i << ": want " << w[i] << " got " << g[i];
        continue;
      }
      if (rtol == 0) {
        ASSERT_EQ(float_bits(w[i]), float_bits(g[i]))
            << what << " at " << i << ": want " << w[i] << " got " << g[i];
      } else if (std::isinf(w[i])) {
        ASSERT_EQ(w[i], g[i]) << what << " at " << i;
      } else {
        ASSERT_NEAR(w[i], g[i], rtol * std::fabs(w[i]) + rtol * 1e-3) << what << " at " << i;
      }
    }
  } else {
    auto w = to_vector<int64_t>(want), g = to_vector<int64_t>(got);
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(w[i], g[i]) << what << " at " << i;
  }
}

// Two results (any device) with the same bytes.
inline void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor ca = a.to(kCPU).contiguous(), cb = b.to(kCPU).contiguous();
  ASSERT_EQ(ca.dtype(), cb.dtype()) << what;
  ASSERT_EQ(ca.sizes(), cb.sizes()) << what;
  EXPECT_EQ(std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()), 0) << what;
}

// max |got - want| <= atol + rtol * max |want| over the values, read as float (norm-wise:
// reduced-precision errors scale with the magnitude of the whole tensor, not of each element).
// got may live on the GPU.
inline void expect_close_normwise(const Tensor& got, const Tensor& want, double atol, double rtol,
                                  const std::string& what) {
  const std::vector<float> g = to_vector<float>(got.detach()), w = to_vector<float>(want.detach());
  ASSERT_EQ(g.size(), w.size()) << what;
  double mag = 0, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    mag = std::max(mag, std::fabs(static_cast<double>(w[i])));
    const double e = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (!(e <= err)) {  // NaN counts as worst
      err = e;
      worst = i;
    }
  }
  if (g.empty()) return;
  EXPECT_LE(err, atol + rtol * mag) << what << ": worst at " << worst << " got " << g[worst]
                                    << " want " << w[worst] << " (max |want| " << mag << ")";
}

}  // namespace td::test
