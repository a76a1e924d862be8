// The CUDA copy engine (copy_, fill_, to(dtype), to(device), contiguous, clone, cat/stack/split,
// float8 conversions) against the CPU backend. Copies and casts must agree bitwise: the kernels
// convert through the same compute types with the same rounding (round-to-nearest-even for
// bf16/f16/fp8, truncation toward zero for float -> int); NaNs only need to stay NaNs (the
// payload of a NaN rounded to bf16/f16 is not specified).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/error.h"
#include "tardelli/tardelli.h"
#if TD_WITH_CUDA
#include "common/fp8.cuh"  // the kernels' FP8 conversion code, checked on the host
#endif

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

// ---- float8 (Note [FP8 dtypes] in core/dtype.h) ----

namespace {

constexpr DType kF8[] = {DType::Float8E4M3FN, DType::Float8E5M2};

std::vector<uint8_t> fp8_codes(const Tensor& t) {
  const Tensor c = t.to(kCPU).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel());
}

Tensor all_fp8_codes(DType dt) {
  Tensor t = Tensor::empty({16, 16}, dt);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (int c = 0; c < 256; ++c) p[c] = static_cast<uint8_t>(c);
  return t;
}

// Floats around every FP8 rounding boundary (every top-19-bit pattern with low bits that decide
// rounding), as in tests/core/test_fp8.cpp, as one float32 tensor.
std::vector<float> fp8_probe_floats() {
  std::vector<float> xs;
  for (uint32_t hi = 0; hi < (1u << 19); ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x0FFFu, 0x1000u, 0x1001u, 0x1FFFu}) {
      const uint32_t u = (hi << 13) | lo;
      float x;
      std::memcpy(&x, &u, 4);
      xs.push_back(x);
    }
  }
  return xs;
}

}  // namespace

#if TD_WITH_CUDA
// Property (Note [FP8 kernel conversions]): the kernels' conversion code, compiled for the host,
// gives the CPU's codes and values for every float around a rounding boundary, both formats and
// both modes. Needs no GPU: it checks the code the device runs, step for step.
TEST(CopyCuda, Fp8KernelConversionCodeMatchesCpu) {
  using kernels::Fp8Kind;
  const std::vector<float> xs = fp8_probe_floats();
  for (bool sat : {false, true}) {
    size_t bad = 0;
    for (float x : xs) {
      bad +=
          kernels::fp8_encode<Fp8Kind::E4M3FN>(x, sat) != fp8_from_float(x, Fp8Format::E4M3FN, sat);
      bad += kernels::fp8_encode<Fp8Kind::E5M2>(x, sat) != fp8_from_float(x, Fp8Format::E5M2, sat);
    }
    EXPECT_EQ(bad, 0u) << "saturate=" << sat;
  }
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float a = kernels::fp8_decode<Fp8Kind::E4M3FN>(code);
    const float b = kernels::fp8_decode<Fp8Kind::E5M2>(code);
    EXPECT_EQ(float_bits(a), float_bits(fp8_to_float(code, Fp8Format::E4M3FN))) << c;
    EXPECT_EQ(float_bits(b), float_bits(fp8_to_float(code, Fp8Format::E5M2))) << c;
  }
}
#endif

// Property: on the GPU, float32 / bfloat16 / float16 tensors (contiguous: the vector kernel;
// transposed: the strided one) convert to the float8 dtypes with the CPU's codes bit for bit,
// with and without saturation (to_fp8); float8 tensors convert back to every dtype with the CPU's
// values; same-dtype copies keep every byte.
TEST(CopyCuda, Fp8CastsMatchCpuBitwise) {
  TD_REQUIRE_CUDA();
  const std::vector<float> probe = fp8_probe_floats();
  const int64_t n = static_cast<int64_t>(probe.size());
  const Tensor x32 = from_vector<float>(probe, {2, n / 2});
  for (DType src : {DType::Float32, DType::BFloat16, DType::Float16}) {
    const Tensor x = x32.to(src);
    const Tensor g = x.to(gpu());
    for (DType dt : kF8) {
      const std::string what = std::string(dtype_name(src)) + " -> " + dtype_name(dt);
      EXPECT_EQ(fp8_codes(g.to(dt)), fp8_codes(x.to(dt))) << what;
      EXPECT_EQ(fp8_codes(g.t().to(dt)), fp8_codes(x.t().to(dt))) << what << " (transposed)";
      EXPECT_EQ(fp8_codes(to_fp8(g, dt, true)), fp8_codes(to_fp8(x, dt, true))) << what << " sat";
      EXPECT_EQ(fp8_codes(to_fp8(g.t(), dt, true)), fp8_codes(to_fp8(x.t(), dt, true)))
          << what << " sat (transposed)";
    }
  }
  for (DType dt : kF8) {
    const Tensor codes = all_fp8_codes(dt);
    const Tensor g = codes.to(gpu());
    EXPECT_EQ(fp8_codes(g), fp8_codes(codes));
    for (DType to : {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::Bool,
                     DType::Float8E4M3FN, DType::Float8E5M2}) {
      const std::string what = std::string(dtype_name(dt)) + " -> " + dtype_name(to);
      const Tensor want = codes.to(to), got = g.to(to), got_t = g.t().to(to);
      if (is_float8(to)) {
        EXPECT_EQ(fp8_codes(got), fp8_codes(want)) << what;
        EXPECT_EQ(fp8_codes(got_t), fp8_codes(codes.t().to(to))) << what << " (transposed)";
      } else if (to == DType::Int32) {  // NaN / inf have no integer value: compare the rest
        const auto w = to_vector<float>(codes.to(DType::Float32));
        const auto gi = to_vector<int32_t>(got), wi = to_vector<int32_t>(want);
        for (int c = 0; c < 256; ++c)
          if (std::isfinite(w[c])) {
            EXPECT_EQ(gi[c], wi[c]) << what << " code " << c;
          }
      } else {
        expect_same_values(want, got, 0.0, what);
        expect_same_values(codes.t().to(to), got_t, 0.0, what + " (transposed)");
      }
    }
    Tensor d = empty({16, 16}, {dt, gpu()});
    d.t().copy_(g);  // same dtype, strided destination: bytes
    EXPECT_EQ(fp8_codes(d.t()), fp8_codes(codes));
    Tensor f = zeros({6, 10}, {dt, gpu()});
    f.slice(1, 1, 10, 3).fill_(-0.3);
    Tensor fc = zeros({6, 10}, {dt});
    fc.slice(1, 1, 10, 3).fill_(-0.3);
    EXPECT_EQ(fp8_codes(f), fp8_codes(fc));
  }
}

// Property: CUDA arithmetic on float8 tensors is refused with a clear error, as on the CPU.
TEST(CopyCuda, Fp8ArithmeticRefused) {
  TD_REQUIRE_CUDA();
  const Tensor a = ones({4}, {DType::Float8E4M3FN, gpu()});
  try {
    add(a, a);
    ADD_FAILURE() << "add on float8 should throw";
  } catch (const td::Error& e) {
    EXPECT_NE(std::string(e.what()).find("float8_e4m3fn"), std::string::npos) << e.what();
  }
}
