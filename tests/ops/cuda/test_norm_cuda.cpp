// layer_norm / rms_norm on CUDA against the CPU backend: forward values and statistics,
// gradients through autograd, awkward sizes, non-contiguous inputs, determinism, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tardelli/autograd/engine.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

struct NormCase {
  bool rms;
  DType dtype;
  int64_t rows, n;
  bool weight, bias;
};

std::string describe_case(const NormCase& c) {
  return std::string(c.rms ? "rms_norm" : "layer_norm") + " " + name(c.dtype) + " [" +
         std::to_string(c.rows) + ", " + std::to_string(c.n) + "]" + (c.weight ? " w" : "") +
         (c.bias ? " b" : "");
}

// Runs the norm on both backends (x given on the CPU, maybe non-contiguous) and compares y and
// every gradient.
void check_norm(const NormCase& c, const Tensor& x_cpu, uint64_t seed) {
  const std::string what = describe_case(c);
  Tensor w_cpu = c.weight ? randn_seeded({c.n}, seed + 1, 0.5, 1.0).to(c.dtype) : Tensor();
  Tensor b_cpu = c.bias ? randn_seeded({c.n}, seed + 2).to(c.dtype) : Tensor();
  Tensor g_cpu = randn_seeded(x_cpu.sizes(), seed + 3, c.dtype);

  Tensor xc = cpu_leaf(x_cpu), xg = gpu_leaf(x_cpu);
  Tensor wc = c.weight ? cpu_leaf(w_cpu) : Tensor(), wg = c.weight ? gpu_leaf(w_cpu) : Tensor();
  Tensor bc = c.bias ? cpu_leaf(b_cpu) : Tensor(), bg = c.bias ? gpu_leaf(b_cpu) : Tensor();
  const Shape ns{c.n};
  Tensor yc = c.rms ? rms_norm(xc, ns, wc) : layer_norm(xc, ns, wc, bc);
  Tensor yg = c.rms ? rms_norm(xg, ns, wg) : layer_norm(xg, ns, wg, bg);
  expect_matches(yg, yc, tol(c.dtype), what + " y");

  TensorList in_c{xc}, in_g{xg};
  if (c.weight) {
    in_c.push_back(wc);
    in_g.push_back(wg);
  }
  if (c.bias) {
    in_c.push_back(bc);
    in_g.push_back(bg);
  }
  TensorList gc = autograd::grad({yc}, in_c, {g_cpu});
  TensorList gg = autograd::grad({yg}, in_g, {g_cpu.to(gpu())});
  ASSERT_EQ(gc.size(), gg.size());
  // dweight / dbias sum `rows` products: scale the tolerance by the summation length.
  const double sum_tol = tol(c.dtype) * (c.dtype == DType::Float32 ? 10.0 : 1.0);
  for (size_t i = 0; i < gc.size(); ++i) {
    expect_matches(gg[i], gc[i], i == 0 ? tol(c.dtype) : sum_tol,
                   what + " grad " + std::to_string(i));
  }
}

TEST(NormCuda, LayerAndRmsMatchCpuOnAwkwardSizes) {
  TD_REQUIRE_CUDA();
  uint64_t seed = 100;
  for (bool rms : {false, true}) {
    for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
      for (int64_t n : {1, 7, 1000, 4096, 8195}) {
        for (int64_t rows : {1, 37}) {
          NormCase c{rms, dt, rows, n, true, !rms};
          ++seed;
          check_norm(c, randn_seeded({rows, n}, seed, 2.0, 0.5).to(dt), seed);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(NormCuda, ManyRowsAndChunkedWeightGradients) {
  TD_REQUIRE_CUDA();
  // rows > 512 puts several rows in each weight-gradient chunk; n = 4096 uses the fused shared
  // accumulators, n = 30000 the column-partials kernel.
  uint64_t seed = 500;
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4099, 7}, {1500, 4096}, {600, 30000}}) {
    for (bool rms : {false, true}) {
      NormCase c{rms, DType::Float32, rows, n, true, !rms};
      ++seed;
      check_norm(c, randn_seeded({rows, n}, seed), seed);
      if (HasFatalFailure()) return;
    }
  }
  NormCase c{false, DType::BFloat16, 2000, 1024, true, true};
  check_norm(c, randn_seeded({2000, 1024}, 77).to(DType::BFloat16), 77);
}

TEST(NormCuda, WithoutAffineParamsAndBiasOnly) {
  TD_REQUIRE_CUDA();
  check_norm({false, DType::Float32, 5, 300, false, false}, randn_seeded({5, 300}, 1), 1);
  check_norm({false, DType::Float32, 5, 300, false, true}, randn_seeded({5, 300}, 2), 2);
  check_norm({true, DType::Float32, 5, 300, false, false}, randn_seeded({5, 300}, 3), 3);
  check_norm({false, DType::BFloat16, 9, 4096, false, true},
             randn_seeded({9, 4096}, 4).to(DType::BFloat16), 4);
}

TEST(NormCuda, NonContiguousAndBatchedInputs) {
  TD_REQUIRE_CUDA();
  // [rows, n] as the transpose of a contiguous [n, rows].
  Tensor xt = transpose(randn_seeded({96, 13}, 9), 0, 1);
  ASSERT_FALSE(xt.is_contiguous());
  check_norm({false, DType::Float32, 13, 96, true, true}, xt, 9);
  check_norm({true, DType::Float32, 13, 96, true, false}, xt, 10);
  // Leading batch dims [2, 3, n].
  check_norm({false, DType::Float32, 6, 1000, true, true}, randn_seeded({2, 3, 1000}, 11), 11);
}

TEST(NormCuda, StatisticsMatchCpu) {
  TD_REQUIRE_CUDA();
  Tensor x = randn_seeded({33, 777}, 21, 3.0, -1.0);
  NormForward c = layer_norm_forward(x, 777, Tensor(), Tensor(), 1e-5);
  NormForward g = layer_norm_forward(x.to(gpu()), 777, Tensor(), Tensor(), 1e-5);
  expect_matches(g.mean, c.mean, 1e-5, "mean");
  expect_matches(g.rstd, c.rstd, 1e-5, "rstd");
  EXPECT_EQ(g.mean.dtype(), DType::Float32);
  NormForward rc = rms_norm_forward(x.to(DType::BFloat16), 777, Tensor(), 1e-6);
  NormForward rg = rms_norm_forward(x.to(DType::BFloat16).to(gpu()), 777, Tensor(), 1e-6);
  EXPECT_FALSE(rg.mean.defined());
  expect_matches(rg.rstd, rc.rstd, 1e-5, "rms rstd");
  expect_matches(rg.y, rc.y, tol(DType::BFloat16), "rms y");
}

TEST(NormCuda, LargeOffsetRowsKeepPrecision) {
  TD_REQUIRE_CUDA();
  // Mean 1000, spread 1: the centred variance (not E[x^2] - E[x]^2) keeps the statistics exact.
  Tensor x = randn_seeded({8, 4096}, 31, 1.0, 1000.0);
  check_norm({false, DType::Float32, 8, 4096, true, true}, x, 31);
}

TEST(NormCuda, WeightGradientsAreBitwiseDeterministic) {
  TD_REQUIRE_CUDA();
  for (int64_t n : {1000, 30000}) {  // fused accumulators, then the column-partials kernel
    const int64_t rows = 3000;
    Tensor x = randn_seeded({rows, n}, 41).to(gpu());
    Tensor g = randn_seeded({rows, n}, 42).to(gpu());
    Tensor w = randn_seeded({n}, 43).to(gpu());
    NormForward f = layer_norm_forward(x, n, w, Tensor(), 1e-5);
    auto [dx1, dw1, db1] = layer_norm_backward(g, x, f.mean, f.rstd, w, true, n);
    auto [dx2, dw2, db2] = layer_norm_backward(g, x, f.mean, f.rstd, w, true, n);
    EXPECT_TRUE(same_bytes(dw1.to(kCPU), dw2.to(kCPU))) << "dweight n=" << n;
    EXPECT_TRUE(same_bytes(db1.to(kCPU), db2.to(kCPU))) << "dbias n=" << n;
    EXPECT_TRUE(same_bytes(dx1.to(kCPU), dx2.to(kCPU))) << "dx n=" << n;
    auto [rdx1, rdw1] = rms_norm_backward(g, x, f.rstd, w, n);
    auto [rdx2, rdw2] = rms_norm_backward(g, x, f.rstd, w, n);
    EXPECT_TRUE(same_bytes(rdw1.to(kCPU), rdw2.to(kCPU))) << "rms dweight n=" << n;
  }
}

TEST(NormCuda, EmptyInput) {
  TD_REQUIRE_CUDA();
  Tensor x = zeros({0, 64}, {DType::Float32, gpu()});
  Tensor w = ones({64}, {DType::Float32, gpu()});
  Tensor b = zeros({64}, {DType::Float32, gpu()});
  Tensor y = layer_norm(x, {64}, w, b);
  EXPECT_EQ(y.sizes(), (Shape{0, 64}));
  NormForward f = layer_norm_forward(x, 64, w, b, 1e-5);
  auto [dx, dw, db] = layer_norm_backward(x, x, f.mean, f.rstd, w, true, 64);
  EXPECT_EQ(dx.sizes(), (Shape{0, 64}));
  for (double v : doubles(dw)) EXPECT_EQ(v, 0.0);
  for (double v : doubles(db)) EXPECT_EQ(v, 0.0);
}

TEST(NormCuda, BadInputsRaise) {
  TD_REQUIRE_CUDA();
  Tensor x = randn_seeded({4, 8}, 51).to(gpu());
  Tensor w_cpu = ones({8});
  EXPECT_THROW(layer_norm(x, {8}, w_cpu), Error);
  EXPECT_THROW(rms_norm(x, {8}, w_cpu), Error);
  EXPECT_THROW(layer_norm(x, {7}), Error);
  EXPECT_THROW(layer_norm(x, {8}, ones({7}, {DType::Float32, gpu()})), Error);
  NormForward f = layer_norm_forward(x, 8, Tensor(), Tensor(), 1e-5);
  EXPECT_THROW(layer_norm_backward(randn_seeded({4, 8}, 52), x, f.mean, f.rstd, Tensor(), false, 8),
               Error);  // grad on the CPU
  EXPECT_THROW(layer_norm_backward(x, x, f.mean.to(kCPU), f.rstd, Tensor(), false, 8), Error);
  EXPECT_THROW(
      layer_norm_backward(x, x, f.mean, zeros({3}, {DType::Float32, gpu()}), Tensor(), false, 8),
      Error);
  EXPECT_THROW(layer_norm(zeros({4, 8}, {DType::Int64, gpu()}), {8}), Error);
}

}  // namespace
