// FP8 on CUDA (ops/fp8.h, kernels/gemm: Note [FP8 GEMM on cuBLASLt]) against the CPU's exact
// emulation: quantization codes, the scaled FP8 product in every operand-format pair (cuBLASLt's
// FP8 kernels where the device has them, the dequantizing fallback elsewhere and for shapes they
// do not take), with and without a bias, and the FP8 linear layer forward and backward. The
// argument checks of the kernel entry point run without a GPU.
//
// Note [FP8 GEMM tolerances]: both sides multiply the same FP8 codes. Each product of two FP8
// values is exact in fp32 (4 x 4 significant bits at most), so the sums differ only in their
// order, and in where the two scale factors are applied (the CPU rounds each dequantized operand
// to fp32, the GPU scales the exact sum once: a relative 2^-23 per term). With operands of unit
// magnitude that is the fp32 GEMM bound of Note [GEMM tolerances] in test_matmul_cuda.cpp,
// atol 2e-5 sqrt(K) and rtol 1e-5. A bf16 output adds its one rounding (rtol 2^-8); a bias
// through the bf16 epilogue may be added after the product was rounded to bf16, so such outputs
// are checked against u (|product| + |want|), u = 2^-8, plus the fp32 atol.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/ops/fp8.h"
#include "tardelli/tardelli.h"
#if TD_WITH_CUDA
#include "gemm/gemm.cuh"
#endif

using namespace td;
using namespace td::test;

namespace {

DType dtype_of_format(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? DType::Float8E4M3FN : DType::Float8E5M2;
}

// Codes of randn values scaled so that their amax meets the format's max: unit-magnitude
// dequantized values spread over the whole format, as delayed/current scaling produces them.
struct Codes {
  Tensor cpu, gpu;
  double scale;
};
Codes codes(const Shape& s, uint64_t seed, Fp8Format f) {
  Tensor x = randn_seeded(s, seed);
  const double scale = fp8_max(f) / amax(x);
  Tensor q = fp8_quantize(x, f, scale);
  return {q, q.to(gpu()), scale};
}

void expect_close_fp8(const Tensor& got, const Tensor& want, const Tensor& product, int64_t k,
                      bool bias_epilogue, const std::string& what) {
  ASSERT_TRUE(got.is_cuda()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const std::vector<double> g = doubles(got.to(kCPU)), w = doubles(want), p = doubles(product);
  const double atol = 2e-5 * std::sqrt(static_cast<double>(k));
  const double u = want.dtype() == DType::BFloat16  ? std::ldexp(1.0, -8)
                   : want.dtype() == DType::Float16 ? std::ldexp(1.0, -10)
                                                    : 1e-5;
  for (size_t i = 0; i < g.size(); ++i) {
    const double bound = atol + u * (std::fabs(w[i]) + (bias_epilogue ? std::fabs(p[i]) : 0.0));
    ASSERT_LE(std::fabs(g[i] - w[i]), bound)
        << what << " element " << i << ": got " << g[i] << ", want " << w[i];
  }
}

}  // namespace

// Property: quantizing on the GPU (one fused scale-and-round pass, kernels::ew_scale_cast_fp8)
// gives the CPU's codes bit for bit (the same fp32 products, then the same rounding: Note [FP8
// conversion code]), saturating values beyond the range, from every floating dtype and from a
// strided view.
TEST(Fp8Cuda, QuantizeMatchesCpuBitwise) {
  TD_REQUIRE_CUDA();
  const Tensor wide = mul(randn_seeded({70, 33}, 5), 300.0);
  const Tensor view = transpose(wide, 0, 1);
  EXPECT_TRUE(
      same_bytes(fp8_quantize(transpose(wide.to(gpu()), 0, 1), Fp8Format::E4M3FN, 0.37).to(kCPU),
                 fp8_quantize(view, Fp8Format::E4M3FN, 0.37)))
      << "a transposed view";
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    Tensor x = mul(randn_seeded({33, 70}, 4), 300.0).to(dt);
    for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
      for (double s : {0.37, 1.0, 1e-3}) {
        Tensor c = fp8_quantize(x, f, s), g = fp8_quantize(x.to(gpu()), f, s);
        ASSERT_TRUE(g.is_cuda());
        ASSERT_EQ(g.dtype(), dtype_of_format(f));
        EXPECT_TRUE(same_bytes(g.to(kCPU), c))
            << fp8_format_name(f) << " scale " << s << " from " << dtype_name(dt);
        EXPECT_TRUE(same_bytes(fp8_dequantize(g, s).to(kCPU), fp8_dequantize(c, s)));
      }
    }
  }
}

// Property: the adaptive policy's statistics (fp8_count: saturated and flushed values) are
// counted on the GPU exactly as on the CPU (the same fp32 products and comparisons).
TEST(Fp8Cuda, CountsMatchCpu) {
  TD_REQUIRE_CUDA();
  Tensor x = mul(randn_seeded({64, 97}, 6), 50.0);
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    for (double s : {1e-4, 0.5, 30.0}) {
      const Fp8Counts c = fp8_count(x, f, s), g = fp8_count(x.to(gpu()), f, s);
      EXPECT_EQ(g.values, c.values);
      EXPECT_EQ(g.overflow, c.overflow) << fp8_format_name(f) << " scale " << s;
      EXPECT_EQ(g.underflow, c.underflow) << fp8_format_name(f) << " scale " << s;
    }
  }
}

// Property: fp8_scaled_mm on the GPU equals the CPU's product of the dequantized operands within
// Note [FP8 GEMM tolerances], for the formats cuBLASLt takes (e4m3 x e4m3, e4m3 x e5m2 and
// e5m2 x e4m3) and e5m2 x e5m2 (the fallback), fp32 and bf16 outputs, with no bias, a bias of
// the output's dtype (the epilogue) and an fp32 bias with a bf16 output (added in fp32), k-major
// operands and transposed views (copied for the kernel), shapes it takes (k, n multiples of 16;
// any m) and shapes it does not (k = 24: the fallback).
TEST(Fp8Cuda, ScaledMmMatchesCpu) {
  TD_REQUIRE_CUDA();
  struct Dims {
    int64_t m, n, k;
    bool transposed;
  };
  const Dims dims[] = {
      {64, 128, 256, false}, {100, 48, 64, false}, {8, 40, 24, false}, {96, 64, 32, true}};
  const Fp8Format E4 = Fp8Format::E4M3FN, E5 = Fp8Format::E5M2;
  const std::pair<Fp8Format, Fp8Format> formats[] = {{E4, E4}, {E5, E4}, {E4, E5}, {E5, E5}};
  for (const Dims& d : dims) {
    for (auto [fa, fb] : formats) {
      // Transposed: the operands are views of [k, m] and [k, n] codes.
      Codes a = d.transposed ? codes({d.k, d.m}, 1, fa) : codes({d.m, d.k}, 1, fa);
      Codes b = d.transposed ? codes({d.k, d.n}, 2, fb) : codes({d.n, d.k}, 2, fb);
      auto view = [&](const Tensor& t) { return d.transposed ? transpose(t, 0, 1) : t; };
      for (DType out : {DType::Float32, DType::BFloat16}) {
        for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {
          if (bias_kind == 2 && out == DType::Float32) continue;
          // 1: a bias of the output's dtype; 2: an fp32 bias with a bf16 output.
          Tensor bias;
          if (bias_kind > 0) {
            bias = randn_seeded({d.n}, 3).to(bias_kind == 1 ? out : DType::Float32);
          }
          const std::string what = "m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) +
                                   " k=" + std::to_string(d.k) +
                                   (d.transposed ? " (views) " : " ") + fp8_format_name(fa) +
                                   " x " + fp8_format_name(fb) + " -> " + dtype_name(out) +
                                   " bias " + std::to_string(bias_kind);
          Tensor want = fp8_scaled_mm(view(a.cpu), a.scale, view(b.cpu), b.scale, out, bias);
          Tensor product =
              fp8_scaled_mm(view(a.cpu), a.scale, view(b.cpu), b.scale, DType::Float32);
          Tensor got = fp8_scaled_mm(view(a.gpu), a.scale, view(b.gpu), b.scale, out,
                                     bias.defined() ? bias.to(gpu()) : Tensor());
          expect_close_fp8(got, want, product, d.k, bias_kind == 1, what);
        }
      }
    }
  }
}

// Property: the FP8 linear layer on the GPU (quantization, the forward GEMM and the two backward
// GEMMs on transposed codes) gives the CPU's output and gradients. Current scaling measures the
// same tensors on both sides, so the scales and codes are equal and only the products' order
// differs (Note [FP8 GEMM tolerances]); the bias gradient is a plain sum (fp32 tolerance).
TEST(Fp8Cuda, LinearForwardAndBackwardMatchCpu) {
  TD_REQUIRE_CUDA();
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor x = randn_seeded({4, 32, 64}, 1).to(dt), w = mul(randn_seeded({96, 64}, 2), 0.1).to(dt);
    Tensor b = mul(randn_seeded({96}, 3), 0.1).to(dt), gy = randn_seeded({4, 32, 96}, 4).to(dt);
    Fp8LinearState sc(/*history=*/0), sg(/*history=*/0);
    Tensor xc = cpu_leaf(x), wc = cpu_leaf(w), bc = cpu_leaf(b);
    Tensor xg = gpu_leaf(x), wg = gpu_leaf(w), bg = gpu_leaf(b);
    Tensor yc = fp8_linear(xc, wc, bc, sc), yg = fp8_linear(xg, wg, bg, sg);
    EXPECT_EQ(sg.input.scale(), sc.input.scale());
    EXPECT_EQ(sg.weight.scale(), sc.weight.scale());
    const std::string name = std::string(" (") + dtype_name(dt) + ")";
    // Outputs: products of unit-scale codes times the weight's scale 0.1; the bias epilogue
    // rounds bf16 products first.
    Tensor prod = fp8_scaled_mm(
        fp8_quantize(reshape(x, {128, 64}), Fp8Format::E4M3FN, sc.input.scale()), sc.input.scale(),
        fp8_quantize(w, Fp8Format::E4M3FN, sc.weight.scale()), sc.weight.scale(), DType::Float32);
    expect_close_fp8(reshape(yg.detach(), {128, 96}), reshape(yc.detach(), {128, 96}), prod, 64,
                     dt == DType::BFloat16, "output" + name);
    yc.backward(gy);
    yg.backward(gy.to(gpu()));
    EXPECT_EQ(sg.grad.scale(), sc.grad.scale());
    expect_close_fp8(xg.grad(), xc.grad(), xc.grad().to(DType::Float32), 96, false,
                     "input gradient" + name);
    expect_close_fp8(wg.grad(), wc.grad(), wc.grad().to(DType::Float32), 128, false,
                     "weight gradient" + name);
    expect_matches(bg.grad(), bc.grad(), tol(dt), "bias gradient" + name);
  }
}

#if TD_WITH_CUDA
// Property: the kernel entry point refuses what cuBLASLt's FP8 kernels cannot do, naming it,
// before it touches a device (so this runs without a GPU too).
TEST(Fp8Cuda, KernelRejectsWhatCublasLtCannotDo) {
  kernels::Fp8GemmArgs g;
  g.m = 32;
  g.n = 32;
  g.k = 32;
  g.lda = g.ldb = 32;
  g.ldc = 32;
  g.a_type = g.b_type = kernels::Fp8Type::kE5M2;
  EXPECT_NE(error_of([&] { kernels::gemm_fp8(g); }).find("no e5m2 x e5m2 kernel"),
            std::string::npos);
  g.a_type = kernels::Fp8Type::kE4M3;
  g.lda = 40;
  EXPECT_NE(error_of([&] { kernels::gemm_fp8(g); }).find("must be multiples of 16"),
            std::string::npos);
  g.lda = 32;
  g.c_type = kernels::GemmType::kFloat32;
  int bias = 0;
  g.bias = &bias;
  EXPECT_NE(error_of([&] { kernels::gemm_fp8(g); }).find("needs a bfloat16 or float16 output"),
            std::string::npos);
}
#endif
