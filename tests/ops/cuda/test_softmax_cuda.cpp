// softmax / log_softmax on CUDA against the CPU backend: values and gradients through autograd,
// rows from 1 to a vocabulary (50257), any dim, non-contiguous inputs, -inf rows, errors.
#include <gtest/gtest.h>

#include <cmath>
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

// softmax or log_softmax of x (CPU, any layout) over dim on both backends: y and dx compared.
void check_softmax(bool log, const Tensor& x_cpu, int64_t dim, uint64_t seed,
                   const std::string& what_in) {
  const DType dt = x_cpu.dtype();
  const std::string what = std::string(log ? "log_softmax " : "softmax ") + name(dt) + " " +
                           shape_str(x_cpu.sizes()) + " dim " + std::to_string(dim) + " " + what_in;
  Tensor xc = cpu_leaf(x_cpu), xg = gpu_leaf(x_cpu);
  Tensor yc = log ? log_softmax(xc, dim) : softmax(xc, dim);
  Tensor yg = log ? log_softmax(xg, dim) : softmax(xg, dim);
  expect_matches(yg, yc, tol(dt), what + " y");
  Tensor g = randn_seeded(x_cpu.sizes(), seed, dt);
  Tensor dc = autograd::grad({yc}, {xc}, {g})[0];
  Tensor dg = autograd::grad({yg}, {xg}, {g.to(gpu())})[0];
  expect_matches(dg, dc, tol(dt), what + " dx");
}

TEST(SoftmaxCuda, LastDimMatchesCpuOnAwkwardSizes) {
  TD_REQUIRE_CUDA();
  uint64_t seed = 1000;
  for (bool log : {false, true}) {
    for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
      for (int64_t n : {1, 7, 1000, 4096, 8195, 50257}) {
        const int64_t rows = n >= 8195 ? 5 : 37;
        ++seed;
        check_softmax(log, randn_seeded({rows, n}, seed, 3.0).to(dt), -1, seed + 7, "");
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(SoftmaxCuda, EveryKernelPathMatchesCpu) {
  TD_REQUIRE_CUDA();
  // Note [CUDA softmax kernels]: a row is n / 4 (fp32) or n / 8 (bf16 / fp16) 16-byte vectors.
  // Each n sits on or just past a dispatch boundary (forward and backward share it).
  struct Path {
    DType dt;
    int64_t n;
  };
  const DType f32 = DType::Float32, bf16 = DType::BFloat16, f16 = DType::Float16;
  const Path paths[] = {
      {f32, 4},       // warp 1 (mostly idle lanes)
      {f32, 132},     // warp 2 (33 vectors)
      {f32, 384},     // warp 3
      {f32, 512},     // warp 4
      {f32, 768},     // warp 6 (GPT-2)
      {f32, 1024},    // warp 8
      {f32, 1028},    // block 128
      {f32, 2052},    // block 256
      {f32, 8192},    // block 512 (its limit)
      {f32, 8196},    // fallback (forward: shared row copy; backward: re-read rows)
      {bf16, 8},      // warp 1
      {bf16, 768},    // warp 3 (GPT-2)
      {bf16, 1536},   // warp 6
      {bf16, 2048},   // warp 8
      {bf16, 2056},   // block 128
      {bf16, 16384},  // block 512 (its limit)
      {bf16, 16392},  // fallback
      {f16, 1024},    // warp 4
      {f16, 4096},    // block 128
  };
  uint64_t seed = 5000;
  for (const Path& p : paths) {
    // 37 rows: not a multiple of the warp path's rows per block.
    const int64_t rows = p.n >= 8192 ? 9 : 37;
    for (bool log : {false, true}) {
      ++seed;
      check_softmax(log, randn_seeded({rows, p.n}, seed, 3.0).to(p.dt), -1, seed + 7, "");
      if (HasFatalFailure()) return;
    }
  }
  check_softmax(false, randn_seeded({8192, 768}, 41).to(DType::BFloat16), -1, 42, "gpt2");
}

TEST(SoftmaxCuda, UnalignedRowsUseTheFallback) {
  TD_REQUIRE_CUDA();
  // Rows one element past a 16-byte boundary (a contiguous view into a larger buffer).
  const int64_t rows = 37, n = 768;
  Tensor xb = randn_seeded({rows * n + 1}, 43, 2.0);
  Tensor x = xb.to(gpu()).narrow(0, 1, rows * n).view({rows, n});
  Tensor xc = xb.narrow(0, 1, rows * n).view({rows, n}).contiguous();
  for (bool log : {false, true}) {
    Tensor yc = log ? log_softmax(xc, 1) : softmax(xc, 1);
    Tensor yg = log ? log_softmax(x, 1) : softmax(x, 1);
    expect_matches(yg, yc, 1e-5, log ? "unaligned log_softmax" : "unaligned softmax");
    Tensor gb = randn_seeded({rows * n + 1}, 44);
    Tensor g = gb.to(gpu()).narrow(0, 1, rows * n).view({rows, n});
    Tensor gc = gb.narrow(0, 1, rows * n).view({rows, n}).contiguous();
    Tensor dc = log ? log_softmax_backward(gc, yc, 1) : softmax_backward(gc, yc, 1);
    Tensor dg = log ? log_softmax_backward(g, yg, 1) : softmax_backward(g, yg, 1);
    expect_matches(dg, dc, 1e-5, log ? "unaligned log_softmax dx" : "unaligned softmax dx");
  }
}

TEST(SoftmaxCuda, ManyShortRows) {
  TD_REQUIRE_CUDA();
  check_softmax(false, randn_seeded({20000, 5}, 1), 1, 2, "");
  check_softmax(true, randn_seeded({3000, 128}, 3).to(DType::BFloat16), 1, 4, "");
}

TEST(SoftmaxCuda, OtherDimsAndNonContiguousInputs) {
  TD_REQUIRE_CUDA();
  Tensor x = randn_seeded({6, 50, 9}, 5, 2.0);
  for (int64_t dim : {0, 1, 2, -2}) {
    check_softmax(false, x, dim, 6, "");
    check_softmax(true, x, dim, 7, "");
  }
  Tensor xt = transpose(randn_seeded({300, 17}, 8), 0, 1);  // [17, 300], strided
  ASSERT_FALSE(xt.is_contiguous());
  check_softmax(false, xt, 1, 9, "transposed");
  check_softmax(true, xt, 1, 10, "transposed");
  check_softmax(false, randn_seeded({}, 11), 0, 12, "0-dim");
}

TEST(SoftmaxCuda, LargeLogitsAndInfinities) {
  TD_REQUIRE_CUDA();
  // Logits near 1000: the max shift keeps exp finite; log_softmax keeps (x - max) exact.
  check_softmax(false, randn_seeded({4, 5000}, 13, 1.0, 1000.0), 1, 14, "offset");
  check_softmax(true, randn_seeded({4, 5000}, 15, 1.0, 1000.0), 1, 16, "offset");
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0 masked in part (-inf gives exactly 0), row 1 entirely (NaN, as the CPU and torch).
  std::vector<float> v = {-inf, 1.f, 2.f, -inf, 0.5f, -inf, -inf, -inf, -inf, -inf};
  // [2, 5] takes the fallback (unaligned rows); [2, 8] (three -inf appended) the warp path.
  std::vector<float> v8;
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < 8; ++j) v8.push_back(j < 5 ? v[static_cast<size_t>(r * 5 + j)] : -inf);
  }
  for (const Tensor& x : {from_vector<float>(v, {2, 5}), from_vector<float>(v8, {2, 8})}) {
    for (bool log : {false, true}) {
      Tensor yc = log ? log_softmax(x, 1) : softmax(x, 1);
      Tensor yg = log ? log_softmax(x.to(gpu()), 1) : softmax(x.to(gpu()), 1);
      const std::vector<double> c = doubles(yc), g = doubles(yg);
      for (size_t i = 0; i < c.size(); ++i) {
        if (std::isnan(c[i])) {
          EXPECT_TRUE(std::isnan(g[i])) << i;
        } else if (std::isinf(c[i])) {
          EXPECT_EQ(g[i], c[i]) << i;
        } else {
          EXPECT_NEAR(g[i], c[i], 1e-6) << i;
        }
      }
    }
  }
}

TEST(SoftmaxCuda, BackwardEntryPointsMatchCpu) {
  TD_REQUIRE_CUDA();
  Tensor y = softmax(randn_seeded({9, 3001}, 17), 1);
  Tensor ly = log_softmax(randn_seeded({9, 3001}, 18), 1);
  Tensor g = randn_seeded({9, 3001}, 19);
  expect_matches(softmax_backward(g.to(gpu()), y.to(gpu()), 1), softmax_backward(g, y, 1), 1e-5,
                 "softmax_backward");
  expect_matches(log_softmax_backward(g.to(gpu()), ly.to(gpu()), 1), log_softmax_backward(g, ly, 1),
                 1e-5, "log_softmax_backward");
  // A gradient of another dtype is converted to y's.
  expect_matches(softmax_backward(g.to(DType::BFloat16).to(gpu()), y.to(gpu()), 1),
                 softmax_backward(g.to(DType::BFloat16), y, 1), 1e-5, "bf16 grad");
}

TEST(SoftmaxCuda, EmptyAndBadInputs) {
  TD_REQUIRE_CUDA();
  Tensor e = zeros({0, 10}, {DType::Float32, gpu()});
  EXPECT_EQ(softmax(e, 1).sizes(), (Shape{0, 10}));
  EXPECT_EQ(log_softmax(zeros({3, 0}, {DType::Float32, gpu()}), 1).sizes(), (Shape{3, 0}));
  Tensor x = randn_seeded({3, 4}, 20).to(gpu());
  EXPECT_THROW(softmax(x, 2), Error);
  EXPECT_THROW(softmax(zeros({3, 4}, {DType::Int64, gpu()}), 1), Error);
  EXPECT_THROW(softmax_backward(randn_seeded({3, 4}, 21), softmax(x, 1), 1), Error);  // CPU grad
  EXPECT_THROW(softmax_backward(randn_seeded({3, 5}, 22).to(gpu()), softmax(x, 1), 1), Error);
}

}  // namespace
