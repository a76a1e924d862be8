// flash_attention_forward / flash_attention_backward on CUDA against the CPU backend on the same
// inputs: the fp32 reference kernels, the bf16/fp16 tensor-core kernels (head dims 64 and 128)
// and the reference kernels for the other bf16 shapes (odd head dims, Dv != D); GQA, causal with
// Tq == Tk and Tq < Tk (bottom-right aligned), sequence lengths that are not multiples of the
// 64-row tiles, non-contiguous inputs, exact causal masking, determinism, edge sizes, bad input.
// The tests named after the own kernels set TD_CUDNN_ATTENTION=0 (else bf16/fp16 would run
// cuDNN's attention, tested in test_attention_cudnn_cuda.cpp); the masking and determinism tests
// run both paths; the rest take the default path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

Tensor gpu(const Tensor& t) {
  return t.to(cuda_device(0));
}
Tensor host(const Tensor& t) {
  return t.detach().to(kCPU);
}

// Same sizes and dtype, then expect_close_normwise (cuda_test_util.h). got may live on the GPU.
void expect_close(const Tensor& got, const Tensor& want, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  expect_close_normwise(got, want, atol, rtol, what);
}

struct Case {
  int64_t B, H, Hkv, Tq, Tk, D, Dv;
  bool causal;
};

std::string name(const Case& c, DType dt) {
  return std::string(dtype_name(dt)) + " B" + std::to_string(c.B) + " H" + std::to_string(c.H) +
         " Hkv" + std::to_string(c.Hkv) + " Tq" + std::to_string(c.Tq) + " Tk" +
         std::to_string(c.Tk) + " D" + std::to_string(c.D) + " Dv" + std::to_string(c.Dv) +
         (c.causal ? " causal" : "");
}

struct Inputs {
  Tensor q, k, v, g;  // CPU
};

Inputs make_inputs(const Case& c, DType dt, uint64_t seed) {
  return {randn_seeded({c.B, c.H, c.Tq, c.D}, seed, dt),
          randn_seeded({c.B, c.Hkv, c.Tk, c.D}, seed + 1, dt),
          randn_seeded({c.B, c.Hkv, c.Tk, c.Dv}, seed + 2, dt),
          randn_seeded({c.B, c.H, c.Tq, c.Dv}, seed + 3, dt)};
}

struct Tol {
  double out, lse, grad;  // relative to the tensor's max magnitude (plus a small absolute term)
};

// Runs forward and backward on both devices and compares out, lse, dq, dk, dv.
void check_case(const Case& c, DType dt, uint64_t seed, const Tol& tol) {
  SCOPED_TRACE(name(c, dt));
  const Inputs in = make_inputs(c, dt, seed);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  AttentionForward want = flash_attention_forward(in.q, in.k, in.v, c.causal, scale);
  AttentionForward got = flash_attention_forward(gpu(in.q), gpu(in.k), gpu(in.v), c.causal, scale);
  EXPECT_TRUE(got.out.is_cuda());
  EXPECT_EQ(got.lse.dtype(), DType::Float32);
  expect_close(got.out, want.out, 1e-5, tol.out, "out");
  expect_close(got.lse, want.lse, 1e-5, tol.lse, "lse");
  // Each side's backward from its own forward, as training would run it.
  auto [dq0, dk0, dv0] =
      flash_attention_backward(in.g, in.q, in.k, in.v, want.out, want.lse, c.causal, scale);
  auto [dq1, dk1, dv1] = flash_attention_backward(gpu(in.g), gpu(in.q), gpu(in.k), gpu(in.v),
                                                  got.out, got.lse, c.causal, scale);
  expect_close(dq1, dq0, 1e-5, tol.grad, "dq");
  expect_close(dk1, dk0, 1e-5, tol.grad, "dk");
  expect_close(dv1, dv0, 1e-5, tol.grad, "dv");
}

// fp32 (reference kernels): both sides compute in fp32 and differ only in summation order over
// at most D and Tk terms of O(1) values; 2e-5 of the magnitude for values (as the CPU tests
// allow against double) and 1e-4 for gradients, whose sums run over Tq and Tk terms.
constexpr Tol kF32Tol{2e-5, 2e-6, 1e-4};
// bf16 (tensor cores): P is rounded to bf16 (relative 2^-9) before P V, dS before dS K and
// dS^T Q, and each side rounds its outputs to bf16 (2^-9 each) and builds delta = rowsum(dO O)
// from its own rounded O; the rounding errors are independent per term, so over a row they
// stay well inside 2% of the output magnitude and 3% of the gradient magnitude (a masking or
// indexing bug moves values by O(1) of the magnitude; MaskingIsExact checks single keys). lse
// is fp32 on both sides from the same bf16 inputs: only summation order differs.
constexpr Tol kBf16Tol{2e-2, 1e-4, 3e-2};
// fp16 carries 3 more mantissa bits than bf16.
constexpr Tol kF16Tol{5e-3, 1e-4, 1e-2};

}  // namespace

TEST(AttentionCuda, Float32ReferencePathMatchesCpu) {
  TD_REQUIRE_CUDA();
  const std::vector<Case> cases = {
      {2, 4, 2, 70, 70, 16, 16, false},   {2, 4, 2, 70, 70, 16, 16, true},
      {1, 3, 1, 37, 100, 40, 40, true},   {1, 2, 2, 130, 130, 64, 64, true},
      {1, 2, 1, 5, 140, 128, 128, false}, {1, 1, 1, 1, 1, 4, 4, true},
      {2, 2, 2, 17, 17, 32, 24, true},    {1, 2, 1, 33, 20, 256, 256, false},
      {1, 1, 1, 200, 200, 33, 33, true},
  };
  uint64_t seed = 1000;
  for (const Case& c : cases) {
    check_case(c, DType::Float32, seed, kF32Tol);
    seed += 10;
  }
}

// bf16 and fp16 with head dims 64 and 128 take the tensor-core kernels: causal and not, GQA,
// Tq < Tk causal, Tq > Tk non-causal, lengths 1, 17, 200 (partial 64-row tiles).
TEST(AttentionCuda, TensorCorePathMatchesCpu) {
  TD_REQUIRE_CUDA();
  ScopedEnv own_kernels("TD_CUDNN_ATTENTION", "0");
  std::vector<Case> cases;
  for (int64_t D : {64, 128}) {
    for (bool causal : {false, true}) {
      cases.push_back({1, 2, 2, 1, 1, D, D, causal});
      cases.push_back({2, 2, 2, 17, 17, D, D, causal});
      cases.push_back({1, 4, 2, 200, 200, D, D, causal});
      cases.push_back({1, 2, 1, 37, 150, D, D, causal});
    }
    cases.push_back({1, 2, 2, 130, 70, D, D, false});
    cases.push_back({2, 4, 1, 128, 128, D, D, true});
  }
  uint64_t seed = 2000;
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    for (const Case& c : cases) {
      check_case(c, dt, seed, dt == DType::BFloat16 ? kBf16Tol : kF16Tol);
      seed += 10;
    }
  }
}

// bf16/fp16 shapes the tensor-core kernels do not take (odd head dim, Dv != D, head dim 256)
// run the reference kernels in the input dtype; same tolerances (outputs rounded to bf16 on both
// sides, fp32 arithmetic otherwise).
TEST(AttentionCuda, ReducedPrecisionReferencePathMatchesCpu) {
  TD_REQUIRE_CUDA();
  ScopedEnv own_kernels("TD_CUDNN_ATTENTION", "0");
  const std::vector<Case> cases = {
      {1, 4, 2, 70, 70, 40, 40, true},
      {1, 2, 1, 17, 33, 64, 32, true},
      {1, 2, 2, 20, 20, 256, 256, false},
  };
  uint64_t seed = 3000;
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    for (const Case& c : cases) {
      check_case(c, dt, seed, dt == DType::BFloat16 ? kBf16Tol : kF16Tol);
      seed += 10;
    }
  }
}

// The tensor-core kernels against the fp32 reference kernels on the same (bf16-valued) inputs,
// both on the GPU: differences are the tensor-core path's rounding of P, dS and the outputs.
TEST(AttentionCuda, TensorCoreMatchesReferenceKernels) {
  TD_REQUIRE_CUDA();
  ScopedEnv own_kernels("TD_CUDNN_ATTENTION", "0");
  const std::vector<Case> cases = {
      {2, 4, 2, 200, 200, 128, 128, true},
      {1, 2, 2, 100, 177, 64, 64, true},
      {1, 2, 1, 65, 129, 64, 64, false},
  };
  uint64_t seed = 4000;
  for (const Case& c : cases) {
    SCOPED_TRACE(name(c, DType::BFloat16));
    const Inputs in = make_inputs(c, DType::BFloat16, seed);
    seed += 10;
    const double scale = 0.1;
    auto f32 = [](const Tensor& t) { return gpu(t.to(DType::Float32)); };
    AttentionForward tc = flash_attention_forward(gpu(in.q), gpu(in.k), gpu(in.v), c.causal, scale);
    AttentionForward ref =
        flash_attention_forward(f32(in.q), f32(in.k), f32(in.v), c.causal, scale);
    expect_close(host(tc.out).to(DType::Float32), ref.out, 1e-5, kBf16Tol.out, "out");
    expect_close(tc.lse, ref.lse, 1e-5, kBf16Tol.lse, "lse");
    auto [dq0, dk0, dv0] = flash_attention_backward(f32(in.g), f32(in.q), f32(in.k), f32(in.v),
                                                    ref.out, ref.lse, c.causal, scale);
    auto [dq1, dk1, dv1] = flash_attention_backward(gpu(in.g), gpu(in.q), gpu(in.k), gpu(in.v),
                                                    tc.out, tc.lse, c.causal, scale);
    expect_close(host(dq1).to(DType::Float32), dq0, 1e-5, kBf16Tol.grad, "dq");
    expect_close(host(dk1).to(DType::Float32), dk0, 1e-5, kBf16Tol.grad, "dk");
    expect_close(host(dv1).to(DType::Float32), dv0, 1e-5, kBf16Tol.grad, "dv");
  }
}

// With q = 0 every visible key gets probability exactly 1 / (number visible), so with
// v[j] = j (exact in bf16 below 256) out[i] is the mean index of the keys row i sees: one key
// too many or too few moves it by about 0.5, far outside the bf16 rounding of the output.
// Covers the causal diagonal tiles with Tq < Tk and keys past Tk in the last tile.
TEST(AttentionCuda, MaskingIsExact) {
  TD_REQUIRE_CUDA();
  for (const char* cudnn : {"0", ""}) {
    SCOPED_TRACE(std::string("TD_CUDNN_ATTENTION=") + cudnn);
    ScopedEnv path("TD_CUDNN_ATTENTION", cudnn);
    struct M {
      int64_t Tq, Tk, D;
      bool causal;
    };
    for (const M& m : {M{150, 200, 64, true}, M{200, 200, 128, true}, M{70, 130, 128, false},
                       M{1, 77, 64, true}, M{64, 64, 64, true}}) {
      SCOPED_TRACE(testing::Message() << "Tq " << m.Tq << " Tk " << m.Tk << " D " << m.D
                                      << (m.causal ? " causal" : ""));
      for (DType dt : {DType::BFloat16, DType::Float32}) {
        Tensor q = zeros({1, 2, m.Tq, m.D}, TensorOptions{.dtype = dt});
        Tensor k = randn_seeded({1, 2, m.Tk, m.D}, 5000, dt);
        std::vector<float> vv(2 * m.Tk * m.D);
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t j = 0; j < m.Tk; ++j)
            for (int64_t d = 0; d < m.D; ++d) vv[(h * m.Tk + j) * m.D + d] = static_cast<float>(j);
        Tensor v = from_vector<float>(vv, {1, 2, m.Tk, m.D}).to(dt);
        AttentionForward f = flash_attention_forward(gpu(q), gpu(k), gpu(v), m.causal, 0.125);
        const std::vector<float> out = to_vector<float>(host(f.out));
        const std::vector<float> lse = to_vector<float>(host(f.lse));
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t i = 0; i < m.Tq; ++i) {
            const int64_t n = m.causal ? i + m.Tk - m.Tq + 1 : m.Tk;
            const double want = (n - 1) / 2.0;
            // bf16 rounds the mean by at most want / 512; a key more or less moves it by 0.5.
            const double tol = want / 256 + 1e-5;
            ASSERT_NEAR(out[(h * m.Tq + i) * m.D], want, tol) << "row " << i;
            ASSERT_NEAR(out[(h * m.Tq + i) * m.D + m.D - 1], want, tol) << "row " << i;
            ASSERT_NEAR(lse[h * m.Tq + i], std::log(static_cast<double>(n)), 1e-4) << "row " << i;
          }
        }
      }
    }
  }
}

// Inputs in [B, T, H, D] memory viewed as [B, H, T, D] (and a bf16 D = 64 slice of a wider
// last dim) are made contiguous and give the CPU values.
TEST(AttentionCuda, NonContiguousInputs) {
  TD_REQUIRE_CUDA();
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor q = randn_seeded({2, 50, 4, 64}, 6000, dt).transpose(1, 2);
    Tensor k = randn_seeded({2, 66, 2, 64}, 6001, dt).transpose(1, 2);
    Tensor v = randn_seeded({2, 66, 2, 80}, 6002, dt).transpose(1, 2).narrow(3, 8, 64);
    Tensor g = randn_seeded({2, 50, 4, 64}, 6003, dt).transpose(1, 2);
    const Tol tol = dt == DType::Float32 ? kF32Tol : kBf16Tol;
    auto to_gpu_view = [](const Tensor& t) {
      // Same strides on the GPU: move the underlying [B, T, H, D] tensor, then view it.
      return gpu(t.transpose(1, 2).contiguous()).transpose(1, 2);
    };
    AttentionForward want = flash_attention_forward(q, k, v, true, 0.3);
    Tensor qg = to_gpu_view(q), kg = to_gpu_view(k), vg = gpu(v), gg = to_gpu_view(g);
    EXPECT_FALSE(qg.is_contiguous());
    AttentionForward got = flash_attention_forward(qg, kg, vg, true, 0.3);
    expect_close(got.out, want.out, 1e-5, tol.out, "out");
    auto [dq0, dk0, dv0] = flash_attention_backward(g, q, k, v, want.out, want.lse, true, 0.3);
    auto [dq1, dk1, dv1] = flash_attention_backward(gg, qg, kg, vg, got.out, got.lse, true, 0.3);
    expect_close(dq1, dq0, 1e-5, tol.grad, "dq");
    expect_close(dk1, dk0, 1e-5, tol.grad, "dk");
    expect_close(dv1, dv0, 1e-5, tol.grad, "dv");
  }
}

// scaled_dot_product_attention on CUDA tensors records the same autograd node; gradients flow
// back to CUDA leaves and equal the CPU ones.
TEST(AttentionCuda, SdpaAutograd) {
  TD_REQUIRE_CUDA();
  const Case c{1, 4, 2, 90, 90, 64, 64, true};
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Inputs in = make_inputs(c, dt, 7000);
    const Tol tol = dt == DType::Float32 ? kF32Tol : kBf16Tol;
    Tensor q0 = in.q.clone().set_requires_grad(true), k0 = in.k.clone().set_requires_grad(true),
           v0 = in.v.clone().set_requires_grad(true);
    Tensor q1 = gpu(in.q).set_requires_grad(true), k1 = gpu(in.k).set_requires_grad(true),
           v1 = gpu(in.v).set_requires_grad(true);
    Tensor o0 = scaled_dot_product_attention(q0, k0, v0, Tensor(), true);
    Tensor o1 = scaled_dot_product_attention(q1, k1, v1, Tensor(), true);
    expect_close(o1, o0, 1e-5, tol.out, "out");
    o0.backward(in.g);
    o1.backward(gpu(in.g));
    ASSERT_TRUE(q1.grad().defined());
    EXPECT_TRUE(q1.grad().is_cuda());
    expect_close(q1.grad(), q0.grad(), 1e-5, tol.grad, "dq");
    expect_close(k1.grad(), k0.grad(), 1e-5, tol.grad, "dk");
    expect_close(v1.grad(), v0.grad(), 1e-5, tol.grad, "dv");
  }
}

// Two backward runs give bitwise identical gradients on both paths (no atomics: fixed
// summation order per key row and per query row, GQA groups summed in head order).
TEST(AttentionCuda, BackwardIsDeterministic) {
  TD_REQUIRE_CUDA();
  for (const char* cudnn : {"0", ""}) {
    ScopedEnv path("TD_CUDNN_ATTENTION", cudnn);
    for (DType dt : {DType::BFloat16, DType::Float32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " TD_CUDNN_ATTENTION=" + cudnn);
      const Case c{2, 4, 1, 300, 300, 128, 128, true};
      const Inputs in = make_inputs(c, dt, 8000);
      Tensor q = gpu(in.q), k = gpu(in.k), v = gpu(in.v), g = gpu(in.g);
      AttentionForward f = flash_attention_forward(q, k, v, true, 0.09);
      AttentionForward f2 = flash_attention_forward(q, k, v, true, 0.09);
      EXPECT_TRUE(test::same_bytes(host(f.out), host(f2.out)));
      EXPECT_TRUE(test::same_bytes(host(f.lse), host(f2.lse)));
      auto a = flash_attention_backward(g, q, k, v, f.out, f.lse, true, 0.09);
      auto b = flash_attention_backward(g, q, k, v, f.out, f.lse, true, 0.09);
      EXPECT_TRUE(test::same_bytes(host(std::get<0>(a)), host(std::get<0>(b))));
      EXPECT_TRUE(test::same_bytes(host(std::get<1>(a)), host(std::get<1>(b))));
      EXPECT_TRUE(test::same_bytes(host(std::get<2>(a)), host(std::get<2>(b))));
    }
  }
}

// Empty sizes behave as on the CPU: no queries give empty outputs and zero dk/dv; no keys give
// NaN rows with lse = -inf.
TEST(AttentionCuda, EdgeSizes) {
  TD_REQUIRE_CUDA();
  Tensor q = gpu(randn_seeded({1, 2, 0, 64}, 9000, DType::BFloat16));
  Tensor k = gpu(randn_seeded({1, 2, 5, 64}, 9001, DType::BFloat16));
  Tensor v = gpu(randn_seeded({1, 2, 5, 64}, 9002, DType::BFloat16));
  AttentionForward f = flash_attention_forward(q, k, v, true, 0.1);
  EXPECT_EQ(f.out.sizes(), Shape({1, 2, 0, 64}));
  auto [dq, dk, dv] = flash_attention_backward(f.out, q, k, v, f.out, f.lse, true, 0.1);
  EXPECT_EQ(dq.sizes(), Shape({1, 2, 0, 64}));
  for (float x : to_vector<float>(host(dk))) EXPECT_EQ(x, 0.f);
  for (float x : to_vector<float>(host(dv))) EXPECT_EQ(x, 0.f);

  Tensor q2 = gpu(randn_seeded({1, 2, 3, 8}, 9003));
  Tensor k2 = gpu(randn_seeded({1, 2, 0, 8}, 9004));
  AttentionForward f2 = flash_attention_forward(q2, k2, k2, false, 0.1);
  for (float x : to_vector<float>(host(f2.out))) EXPECT_TRUE(std::isnan(x));
  for (float x : to_vector<float>(host(f2.lse))) EXPECT_EQ(x, -INFINITY);
}

// Tensors on different devices, head dims past the CUDA limit, and the CPU front-end's checks
// (causal with Tq > Tk, lse shape) raise td::Error.
TEST(AttentionCuda, BadInputIsAnError) {
  TD_REQUIRE_CUDA();
  Tensor q = randn_seeded({1, 2, 4, 8}, 9100), k = randn_seeded({1, 2, 4, 8}, 9101);
  Tensor v = randn_seeded({1, 2, 4, 8}, 9102);
  EXPECT_THROW(flash_attention_forward(gpu(q), k, gpu(v), false, 1.0), Error);
  EXPECT_THROW(scaled_dot_product_attention(gpu(q), gpu(k), v), Error);
  Tensor big = gpu(randn_seeded({1, 1, 4, 264}, 9103));
  EXPECT_THROW(flash_attention_forward(big, big, big, false, 1.0), Error);
  EXPECT_THROW(
      flash_attention_forward(gpu(randn_seeded({1, 2, 6, 8}, 9104)), gpu(k), gpu(v), true, 1.0),
      Error);
  AttentionForward f = flash_attention_forward(gpu(q), gpu(k), gpu(v), false, 1.0);
  EXPECT_THROW(
      flash_attention_backward(gpu(q), gpu(q), gpu(k), gpu(v), f.out, host(f.lse), false, 1.0),
      Error);  // lse on the CPU
  EXPECT_THROW(flash_attention_backward(gpu(q), gpu(q), gpu(k), gpu(v), f.out,
                                        gpu(randn_seeded({1, 2, 3}, 9105)), false, 1.0),
               Error);  // lse shape
  EXPECT_THROW(flash_attention_forward(gpu(q), gpu(k.to(DType::BFloat16)), gpu(v), false, 1.0),
               Error);  // dtype
}
