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
  // Several rows in each weight-gradient chunk: n = 7 (unaligned rows) uses the fallback's fused
  // shared accumulators, n = 4096 the block register path, n = 30000 the column-partials kernel.
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

TEST(NormCuda, EveryKernelPathMatchesCpu) {
  TD_REQUIRE_CUDA();
  // Note [CUDA norm kernels]: a row is n / 4 (fp32) or n / 8 (bf16 / fp16) 16-byte vectors.
  // Each n sits on or just past a dispatch boundary; the comment names the forward path, then
  // the backward path (warp k: a warp per row, k vectors a lane; block t: t threads per row).
  struct Path {
    DType dt;
    int64_t n;
  };
  const DType f32 = DType::Float32, bf16 = DType::BFloat16, f16 = DType::Float16;
  const Path paths[] = {
      {f32, 4},       // warp 1 (mostly idle lanes); warp 1, two rows at once
      {f32, 132},     // warp 2 (33 vectors); warp 2
      {f32, 384},     // warp 3; warp 3
      {f32, 512},     // warp 4; warp 4
      {f32, 768},     // warp 6 (GPT-2); warp 6, two rows at once
      {f32, 1024},    // warp 8; warp 8, one row at a time
      {f32, 1028},    // block 128; block 128
      {f32, 2052},    // block 256; block 256
      {f32, 4096},    // block 256; block 256
      {f32, 4100},    // block 512; fallback (shared accumulators)
      {f32, 8192},    // block 512 (its limit); fallback
      {f32, 8196},    // fallback (shared row copy); fallback
      {bf16, 8},      // warp 1; warp 1
      {bf16, 264},    // warp 2 (33 vectors); warp 2
      {bf16, 768},    // warp 3 (GPT-2); warp 3, two rows at once
      {bf16, 1024},   // warp 4; warp 4, one row at a time (the backward warp limit)
      {bf16, 1536},   // warp 6; block 128
      {bf16, 2048},   // warp 8; block 128
      {bf16, 2056},   // block 128; block 256
      {bf16, 4104},   // block 256; fallback
      {bf16, 16384},  // block 512 (its limit); fallback
      {bf16, 16392},  // fallback (re-read rows); fallback (column partials)
      {f16, 768},     // warp 3; warp 3
      {f16, 4096},    // block 128; block 256
  };
  uint64_t seed = 3000;
  for (const Path& p : paths) {
    // 37 rows: one row per chunk, rows not a multiple of the rows per block. 1000 rows: chunks of
    // 7 rows, the last warp or row pair of each chunk partly empty.
    for (int64_t rows : {int64_t{37}, int64_t{1000}}) {
      if (rows * p.n > (int64_t{1} << 23)) continue;
      for (bool rms : {false, true}) {
        NormCase c{rms, p.dt, rows, p.n, true, !rms};
        ++seed;
        check_norm(c, randn_seeded({rows, p.n}, seed, 1.5, 0.25).to(p.dt), seed);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(NormCuda, GptShapesAndLongChunks) {
  TD_REQUIRE_CUDA();
  // 64-row chunks: each backward warp takes eight rows (four pairs) and the block adds its eight
  // warps' sums; 16384 rows of 1024: 256 chunks.
  uint64_t seed = 4000;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (auto [rows, n] : {std::pair<int64_t, int64_t>{8192, 768}, {16384, 1024}}) {
      NormCase c{false, dt, rows, n, true, true};
      ++seed;
      check_norm(c, randn_seeded({rows, n}, seed).to(dt), seed);
      if (HasFatalFailure()) return;
    }
  }
  NormCase c{true, DType::BFloat16, 8192, 4096, true, false};  // block path, 64-row chunks
  check_norm(c, randn_seeded({8192, 4096}, 77).to(DType::BFloat16), 77);
}

TEST(NormCuda, UnalignedRowsUseTheFallback) {
  TD_REQUIRE_CUDA();
  // x and g one element past a 16-byte boundary (contiguous views into larger buffers): the
  // register paths need aligned rows, so these take the fallback kernels.
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    const int64_t rows = 37, n = 768;
    Tensor xb = randn_seeded({rows * n + 1}, 61).to(dt),
           gb = randn_seeded({rows * n + 1}, 62).to(dt);
    Tensor x = xb.to(gpu()).narrow(0, 1, rows * n).view({rows, n});
    Tensor g = gb.to(gpu()).narrow(0, 1, rows * n).view({rows, n});
    Tensor xc = xb.narrow(0, 1, rows * n).view({rows, n}).contiguous();
    Tensor gc = gb.narrow(0, 1, rows * n).view({rows, n}).contiguous();
    Tensor w = randn_seeded({n}, 63), b = randn_seeded({n}, 64);
    NormForward fc = layer_norm_forward(xc, n, w, b, 1e-5);
    NormForward fg = layer_norm_forward(x, n, w.to(gpu()), b.to(gpu()), 1e-5);
    const std::string what = std::string("unaligned ") + name(dt);
    expect_matches(fg.y, fc.y, tol(dt), what + " y");
    expect_matches(fg.rstd, fc.rstd, 1e-5, what + " rstd");
    auto [dxc, dwc, dbc] = layer_norm_backward(gc, xc, fc.mean, fc.rstd, w, true, n);
    auto [dxg, dwg, dbg] = layer_norm_backward(g, x, fg.mean, fg.rstd, w.to(gpu()), true, n);
    expect_matches(dxg, dxc, tol(dt), what + " dx");
    expect_matches(dwg, dwc, tol(dt), what + " dw");
    expect_matches(dbg, dbc, tol(dt), what + " db");
  }
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
  // warp path (n 768), block path (4096), fused shared accumulators (6000), column partials (30000)
  for (int64_t n : {768, 4096, 6000, 30000}) {
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
