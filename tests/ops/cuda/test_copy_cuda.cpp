// The CUDA copy engine (copy_, fill_, to(dtype), to(device), contiguous, clone, cat/stack/split)
// against the CPU backend. Copies and casts must agree bitwise: the kernels convert through the
// same compute types with the same rounding (round-to-nearest-even for bf16/f16, truncation
// toward zero for float -> int); NaNs only need to stay NaNs (the payload of a NaN rounded to
// bf16/f16 is not specified).
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

// Values of every kind a cast meets: fractions, negatives, integers beyond 2^24 (rounding in
// float), and, for float -> float casts, inf, NaN, values that overflow f16 and subnormals.
Tensor source_values(DType src, DType dst, int64_t n) {
  Tensor base = mul(randn({n}), 300.0);  // within int32 and f16 range
  if (is_floating(src) && is_floating(dst) && n >= 8) {
    std::vector<float> special = {INFINITY, -INFINITY, NAN, 1e5f, -7e4f, 1e-40f, -3e-8f, 0.f};
    for (size_t i = 0; i < special.size(); ++i)
      base.select(0, static_cast<int64_t>(i)).fill_(special[i]);
  }
  if (src == DType::Int64 && n >= 4) {
    base = base.to(DType::Int64);
    std::vector<double> big = {16777217.0, -(1LL << 40) - 3.0, 4294967301.0, 123456789.0};
    for (size_t i = 0; i < big.size(); ++i) base.select(0, static_cast<int64_t>(i)).fill_(big[i]);
    return base;  // int64 -> int32 keeps the low 32 bits on both backends
  }
  if (src == DType::Bool) return gt(base, 0.0);
  return base.to(src);
}

}  // namespace

TEST(CopyCuda, RoundTripEveryDtypeIsBitwise) {
  TD_REQUIRE_CUDA();
  for (DType dt : kAll) {
    for (int64_t n : {0, 1, 7, 1000003}) {
      Tensor x = source_values(dt, dt, n);
      Tensor g = x.to(gpu());
      EXPECT_TRUE(g.is_cuda());
      EXPECT_EQ(g.dtype(), dt);
      expect_same_values(x, g.to(kCPU), 0.0, std::string("round trip ") + dtype_name(dt));
    }
  }
}

TEST(CopyCuda, CastEveryPairMatchesCpu) {
  TD_REQUIRE_CUDA();
  for (DType src : kAll) {
    for (DType dst : kAll) {
      Tensor x = source_values(src, dst, 4099);
      std::string what = std::string(dtype_name(src)) + " -> " + dtype_name(dst);
      expect_same_values(x.to(dst), x.to(gpu()).to(dst), 0.0, what);
      // Strided source and destination (the strided kernel, not the vector one).
      Tensor x2 = x.narrow(0, 1, 4096).view({64, 64}).t();
      expect_same_values(x2.to(dst), x2.to(gpu()).to(dst), 0.0, what + " (transposed)");
      Tensor d = zeros({64, 128}, {dst, gpu()}).slice(1, 0, 128, 2);
      d.copy_(x2.to(gpu()));
      expect_same_values(x2.to(dst), d, 0.0, what + " (into a strided view)");
    }
  }
}

TEST(CopyCuda, StridedBroadcastZeroDimAndEmpty) {
  TD_REQUIRE_CUDA();
  for (DType dt : kAll) {
    Tensor x = source_values(dt, dt, 2 * 3 * 5 * 7).view({2, 3, 5, 7});
    Tensor g = x.to(gpu());
    std::string name = dtype_name(dt);
    // contiguous() of every kind of permutation of a 4-d tensor.
    for (Shape perm :
         {Shape{3, 2, 1, 0}, Shape{0, 2, 1, 3}, Shape{1, 3, 0, 2}, Shape{2, 0, 3, 1}}) {
      Tensor p = g.permute(perm).contiguous();
      EXPECT_TRUE(p.is_contiguous());
      expect_same_values(x.permute(perm).contiguous(), p, 0.0, name + " permute");
    }
    // Slices with steps, selected rows, expanded (stride 0) sources.
    expect_same_values(x.slice(3, 1, 7, 3).contiguous(), g.slice(3, 1, 7, 3).contiguous(), 0.0,
                       name + " slice");
    expect_same_values(x.select(1, 2).contiguous(), g.select(1, 2).contiguous(), 0.0,
                       name + " select");
    Tensor row = x.select(0, 1).select(0, 0).select(0, 3);  // [7]
    Tensor e = empty({4, 5, 7}, {dt, gpu()});
    e.copy_(row.to(gpu()));
    expect_same_values(row.expand({4, 5, 7}).contiguous(), e, 0.0, name + " broadcast copy_");
    expect_same_values(x.select(0, 1).unsqueeze(0).expand({3, 3, 5, 7}).contiguous(),
                       g.select(0, 1).unsqueeze(0).expand({3, 3, 5, 7}).contiguous(), 0.0,
                       name + " expand");
    // 0-d tensors and empty tensors.
    Tensor s = x.view({-1}).select(0, 11);
    expect_same_values(s.clone(), s.to(gpu()).clone(), 0.0, name + " 0-d");
    Tensor z = empty({0, 5}, {dt, gpu()});
    EXPECT_EQ(z.clone().numel(), 0);
    EXPECT_EQ(z.t().contiguous().numel(), 0);
    z.fill_(1.0);
  }
}

// More elements than 65535 blocks of 256 threads: the grid-stride loops must cover them all.
TEST(CopyCuda, LargeTensors) {
  TD_REQUIRE_CUDA();
  const int64_t rows = 4099, cols = 5003;  // 20.5M elements, odd sizes
  Tensor x = randn({rows, cols});
  Tensor g = x.to(gpu());
  expect_same_values(x.to(DType::BFloat16), g.to(DType::BFloat16), 0.0, "large cast");
  expect_same_values(x.t().contiguous(), g.t().contiguous(), 0.0, "large transpose");
  Tensor f = empty({rows, cols}, {DType::Float16, gpu()});
  f.fill_(-2.5);
  auto v = to_vector<float>(f.slice(0, rows - 2, rows));
  for (float e : v) ASSERT_EQ(e, -2.5f);
}

TEST(CopyCuda, FillOnStridedViewsLeavesTheRest) {
  TD_REQUIRE_CUDA();
  for (DType dt : kAll) {
    for (double value : {3.75, 0.0, -1.0}) {
      Tensor c = zeros({6, 10}, {dt, kCPU});
      Tensor g = zeros({6, 10}, {dt, gpu()});
      c.slice(1, 1, 10, 3).fill_(value);
      g.slice(1, 1, 10, 3).fill_(value);
      c.t().select(0, 4).fill_(value + 1);
      g.t().select(0, 4).fill_(value + 1);
      expect_same_values(c, g, 0.0, std::string("fill_ ") + dtype_name(dt));
      Tensor c2 = full({1001}, value, {dt, kCPU});
      Tensor g2 = full({1001}, value, {dt, gpu()});
      expect_same_values(c2, g2, 0.0, std::string("full ") + dtype_name(dt));
    }
  }
}

TEST(CopyCuda, ToDeviceCarriesGradientsBack) {
  TD_REQUIRE_CUDA();
  Tensor x = randn({5, 3}).set_requires_grad(true);
  Tensor y = x.to(gpu());
  EXPECT_TRUE(y.is_cuda());
  EXPECT_TRUE(y.requires_grad());
  Tensor z = mul(y.to(DType::BFloat16), 3.0).to(DType::Float32).to(kCPU);
  Tensor w = randn({5, 3});
  sum(mul(z, w)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(x.grad().is_cpu());
  // d/dx of 3 * bf16(x) * w is 3 * w (bf16 rounding passes the gradient straight through, the
  // gradient itself is rounded to bf16 on the way back: relative 2^-8).
  auto gv = to_vector<float>(x.grad()), wv = to_vector<float>(w);
  for (size_t i = 0; i < gv.size(); ++i)
    EXPECT_NEAR(gv[i], 3 * wv[i], 1e-2 * std::fabs(3 * wv[i]) + 1e-6);
  // clone and contiguous on CUDA are differentiable too.
  Tensor a = randn({4, 6}, {DType::Float32, gpu()}).set_requires_grad(true);
  Tensor b = a.t().contiguous().clone().to(kCPU);
  sum(b).backward();
  expect_same_values(ones({4, 6}), a.grad(), 0.0, "clone/contiguous gradient");
}

TEST(CopyCuda, CatStackSplit) {
  TD_REQUIRE_CUDA();
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Int64, DType::Bool}) {
    Tensor a = source_values(dt, dt, 2 * 3 * 4).view({2, 3, 4});
    Tensor b = source_values(dt, dt, 2 * 5 * 4).view({2, 5, 4});
    Tensor ga = a.to(gpu()), gb = b.to(gpu());
    std::string name = dtype_name(dt);
    expect_same_values(cat({a, b}, 1), cat({ga, gb}, 1), 0.0, name + " cat");
    expect_same_values(cat({a.transpose(0, 2), b.transpose(0, 2)}, 1),
                       cat({ga.transpose(0, 2), gb.transpose(0, 2)}, 1), 0.0,
                       name + " cat strided");
    expect_same_values(stack({a, a}, 2), stack({ga, ga}, 2), 0.0, name + " stack");
    auto cs = split(b, 2, 1);
    auto gs = split(gb, 2, 1);
    ASSERT_EQ(cs.size(), gs.size());
    for (size_t i = 0; i < cs.size(); ++i)
      expect_same_values(cs[i].contiguous(), gs[i].contiguous(), 0.0, name + " split");
  }
  // Gradients through cat on CUDA.
  Tensor a = randn({3, 4}, {DType::Float32, gpu()}).set_requires_grad(true);
  Tensor b = randn({2, 4}, {DType::Float32, gpu()}).set_requires_grad(true);
  Tensor w = randn({5, 4});
  sum(mul(cat({a, b}, 0).to(kCPU), w)).backward();
  expect_same_values(w.narrow(0, 0, 3).contiguous(), a.grad(), 0.0, "cat gradient a");
  expect_same_values(w.narrow(0, 3, 2).contiguous(), b.grad(), 0.0, "cat gradient b");
}

TEST(CopyCuda, MixedDevicesAreErrorsNamingTheOp) {
  TD_REQUIRE_CUDA();
  Tensor c = randn({4}), g = randn({4}, {DType::Float32, gpu()});
  auto expect_error = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << op << ": expected td::Error";
    } catch (const td::Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
    }
  };
  expect_error([&] { cat({c, g}); }, "cat");
  expect_error([&] { add(g, c); }, "add");
  expect_error([&] { mul(c, g); }, "mul");
  expect_error([&] { where(gt(g, 0.0), g, c); }, "where");
  expect_error([&] { masked_fill(g, gt(c, 0.0), 1.0); }, "masked_fill");
  // copy_ between devices is allowed and converts.
  Tensor d = empty({4}, {DType::BFloat16, gpu()});
  d.copy_(c);
  expect_same_values(c.to(DType::BFloat16), d, 0.0, "copy_ across devices");
  Tensor h = empty({2, 4}, {DType::Float32, kCPU});
  h.copy_(g);  // broadcast from CUDA
  expect_same_values(g.to(kCPU).expand({2, 4}).contiguous(), h, 0.0, "broadcast copy_ to the CPU");
}

// Note [Host snapshot]: host_snapshot of a CUDA tensor is a page-locked host copy filled on the
// snapshot stream; work queued afterwards on the current stream (an in-place update, as the next
// optimizer step does) waits for the copy, so after wait_host_snapshot the snapshot holds the
// values at snapshot time, bitwise, while the device tensor holds the updated ones.
TEST(CopyCuda, HostSnapshotKeepsTheValuesAtSnapshotTime) {
  TD_REQUIRE_CUDA();
  Tensor x = randn({1 << 20});
  Tensor g = x.to(gpu());
  Tensor snap = host_snapshot(g);
  EXPECT_TRUE(snap.device().is_cpu());
  mul_(g, 2.0);  // queued after the copy on the current stream
  wait_host_snapshot(g.device());
  EXPECT_TRUE(same_bytes(snap, x));
  expect_same_values(mul(x, 2.0), g.to(kCPU), 0.0, "the update after the snapshot");
  Tensor c = host_snapshot(x);  // a CPU tensor: a plain clone
  EXPECT_TRUE(same_bytes(c, x));
  EXPECT_NE(c.data_ptr(), x.data_ptr());
}
