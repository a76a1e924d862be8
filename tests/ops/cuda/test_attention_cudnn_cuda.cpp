// The cuDNN path of flash_attention_forward / flash_attention_backward (Note [cuDNN attention] in
// kernels/attention/cudnn_attention.cuh): its outputs, lse and gradients against the CPU backend
// and against Tardelli's own kernels (TD_CUDNN_ATTENTION=0) for bf16 and fp16, causal and not,
// GQA, head dims 64 and 128, lengths that are not multiples of 64, Tq != Tk; that the path taken
// is cuDNN (and the own kernels with TD_CUDNN_ATTENTION=0, for fp32, for head dims cuDNN never
// takes); that a forward on one path and a backward on the other agree (one lse format); that
// the backward is deterministic. Skips without a GPU, and without the frontend in the build.
#include <gtest/gtest.h>

// The kernels' headers exist only in CUDA builds; a CPU build compiles this file empty.
#if TD_WITH_CUDA

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "attention/cudnn_attention.cuh"
#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;
using kernels::AttentionBackend;

namespace {

#define TD_REQUIRE_CUDNN_ATTENTION()                                                     \
  TD_REQUIRE_CUDA();                                                                     \
  if (!kernels::cudnn_attention_compiled()) {                                            \
    GTEST_SKIP() << "this build has no cuDNN frontend (attention runs the own kernels)"; \
  }

Tensor gpu(const Tensor& t) {
  return t.to(cuda_device(0));
}
Tensor host(const Tensor& t) {
  return t.detach().to(kCPU);
}

// Same sizes, then expect_close_normwise (cuda_test_util.h); dtypes may differ.
void expect_close(const Tensor& got, const Tensor& want, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  expect_close_normwise(got, want, atol, rtol, what);
}

struct Case {
  int64_t B, H, Hkv, Tq, Tk, D;
  bool causal;
  double scale;
};

std::string name(const Case& c, DType dt) {
  return std::string(dtype_name(dt)) + " B" + std::to_string(c.B) + " H" + std::to_string(c.H) +
         " Hkv" + std::to_string(c.Hkv) + " Tq" + std::to_string(c.Tq) + " Tk" +
         std::to_string(c.Tk) + " D" + std::to_string(c.D) + (c.causal ? " causal" : "") +
         " scale " + std::to_string(c.scale);
}

struct Result {
  AttentionForward f;
  Tensor dq, dk, dv;
  AttentionBackend fwd_path, bwd_path;
};

// Forward then backward (from that forward) on the inputs' device, recording the paths taken.
Result run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Case& c) {
  Result r;
  r.f = flash_attention_forward(q, k, v, c.causal, c.scale);
  r.fwd_path = kernels::last_attention_backend(false);
  std::tie(r.dq, r.dk, r.dv) =
      flash_attention_backward(g, q, k, v, r.f.out, r.f.lse, c.causal, c.scale);
  r.bwd_path = kernels::last_attention_backend(true);
  return r;
}

struct Tol {
  double out, lse, grad;
};

// Note [cuDNN attention tolerances]: cuDNN's flash attention, like the own tensor-core kernels,
// multiplies bf16/fp16 inputs with fp32 accumulation, keeps the online softmax in fp32, rounds P
// to the input format before P V (and dS before dS K, dS^T Q), and rounds its outputs once.
// Against the CPU (fp32 arithmetic, outputs rounded once), the output then differs by the
// rounding of P (relative 2^-9 per term, independent, so a row's sum moves far less than the
// sum of the bounds) plus one rounding of each side's output: a few bf16 ulps (one ulp is 2^-8
// to 2^-7 of a value) of the output's magnitude, so 2e-2 of the max |out| (5 ulps at most);
// gradients add the rounding of dS and of delta = rowsum(dO O) from the rounded O: 3e-2 of
// their max magnitude. fp16 has 3 more mantissa bits: 5e-3 and 1e-2. lse is fp32 on both sides
// from the same inputs (only the summation order and cuDNN's exp2 with log2(e) folded into the
// scale differ): 1e-4 of its magnitude. A masking, scaling or layout bug moves values by O(1)
// of the magnitude. Against the own kernels each side is within the CPU bound, so the bound
// between them is twice that.
constexpr Tol kBf16Tol{2e-2, 1e-4, 3e-2};
constexpr Tol kF16Tol{5e-3, 1e-4, 1e-2};

void check_case(const Case& c, DType dt, uint64_t seed, bool must_be_cudnn) {
  SCOPED_TRACE(name(c, dt));
  const Tol tol = dt == DType::BFloat16 ? kBf16Tol : kF16Tol;
  const Tensor q = randn_seeded({c.B, c.H, c.Tq, c.D}, seed, dt);
  const Tensor k = randn_seeded({c.B, c.Hkv, c.Tk, c.D}, seed + 1, dt);
  const Tensor v = randn_seeded({c.B, c.Hkv, c.Tk, c.D}, seed + 2, dt);
  const Tensor g = randn_seeded({c.B, c.H, c.Tq, c.D}, seed + 3, dt);
  const Result cpu = run(q, k, v, g, c);
  const Tensor qg = gpu(q), kg = gpu(k), vg = gpu(v), gg = gpu(g);
  const Result cudnn = run(qg, kg, vg, gg, c);
  if (must_be_cudnn) {
    EXPECT_EQ(cudnn.fwd_path, AttentionBackend::Cudnn)
        << kernels::cudnn_attention_forward_plan(
               {c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.D, c.causal, static_cast<float>(c.scale)},
               dt == DType::BFloat16 ? kernels::AttentionDType::BFloat16
                                     : kernels::AttentionDType::Float16)
               .refusal;
    EXPECT_EQ(cudnn.bwd_path, AttentionBackend::Cudnn);
  } else if (cudnn.fwd_path != AttentionBackend::Cudnn ||
             cudnn.bwd_path != AttentionBackend::Cudnn) {
    std::printf("note: cuDNN did not take %s (forward %s, backward %s): checked the fallback\n",
                name(c, dt).c_str(), cudnn.fwd_path == AttentionBackend::Cudnn ? "cuDNN" : "own",
                cudnn.bwd_path == AttentionBackend::Cudnn ? "cuDNN" : "own");
  }
  Result own;
  {
    ScopedEnv off("TD_CUDNN_ATTENTION", "0");
    own = run(qg, kg, vg, gg, c);
    EXPECT_EQ(own.fwd_path, AttentionBackend::Own);
    EXPECT_EQ(own.bwd_path, AttentionBackend::Own);
  }
  expect_close(cudnn.f.out, cpu.f.out, 1e-5, tol.out, "out vs CPU");
  expect_close(cudnn.f.lse, cpu.f.lse, 1e-5, tol.lse, "lse vs CPU");
  expect_close(cudnn.dq, cpu.dq, 1e-5, tol.grad, "dq vs CPU");
  expect_close(cudnn.dk, cpu.dk, 1e-5, tol.grad, "dk vs CPU");
  expect_close(cudnn.dv, cpu.dv, 1e-5, tol.grad, "dv vs CPU");
  expect_close(cudnn.f.out, own.f.out, 1e-5, 2 * tol.out, "out vs own kernels");
  expect_close(cudnn.f.lse, own.f.lse, 1e-5, 2 * tol.lse, "lse vs own kernels");
  expect_close(cudnn.dq, own.dq, 1e-5, 2 * tol.grad, "dq vs own kernels");
  expect_close(cudnn.dk, own.dk, 1e-5, 2 * tol.grad, "dk vs own kernels");
  expect_close(cudnn.dv, own.dv, 1e-5, 2 * tol.grad, "dv vs own kernels");
}

}  // namespace

// Tq == Tk: causal and not, GQA (4 and 8 query heads per key/value head), D 64 and 128,
// lengths 77 and 200 (not multiples of 64), a scale other than 1/sqrt(D). cuDNN 9 runs all of
// these on sm_80/sm_90, so the path must be cuDNN.
TEST(AttentionCudnn, MatchesCpuAndOwnKernels) {
  TD_REQUIRE_CUDNN_ATTENTION();
  ScopedEnv deflt("TD_CUDNN_ATTENTION", nullptr);
  uint64_t seed = 100;
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    for (int64_t D : {64, 128}) {
      const double s = 1.0 / std::sqrt(static_cast<double>(D));
      for (bool causal : {true, false}) {
        for (const Case& c :
             {Case{2, 4, 4, 128, 128, D, causal, s}, Case{1, 8, 2, 77, 77, D, causal, s},
              Case{1, 8, 1, 200, 200, D, causal, 0.3}}) {
          check_case(c, dt, seed, /*must_be_cudnn=*/true);
          seed += 10;
        }
      }
    }
  }
}

// Tq != Tk (causal bottom-right aligned with Tq < Tk; non-causal Tq > Tk): cuDNN versions differ
// in what they take here, so a refusal is allowed (and reported); whatever ran must be right.
TEST(AttentionCudnn, UnequalLengths) {
  TD_REQUIRE_CUDNN_ATTENTION();
  ScopedEnv deflt("TD_CUDNN_ATTENTION", nullptr);
  uint64_t seed = 500;
  for (int64_t D : {64, 128}) {
    check_case({1, 4, 2, 37, 150, D, true, 0.125}, DType::BFloat16, seed, false);
    check_case({1, 4, 2, 150, 37, D, false, 0.125}, DType::BFloat16, seed + 10, false);
    seed += 20;
  }
}

// The path actually taken: cuDNN by default for bf16/fp16; the own kernels with
// TD_CUDNN_ATTENTION=0, for fp32, and for head dims that are not multiples of 8;
// TD_CUDNN_ATTENTION=1 turns "not cuDNN" into an error; other values are an error.
TEST(AttentionCudnn, PathSelection) {
  TD_REQUIRE_CUDNN_ATTENTION();
  auto inputs = [](DType dt, int64_t D) {
    return std::vector<Tensor>{
        gpu(randn_seeded({1, 2, 96, D}, 1, dt)), gpu(randn_seeded({1, 2, 96, D}, 2, dt)),
        gpu(randn_seeded({1, 2, 96, D}, 3, dt)), gpu(randn_seeded({1, 2, 96, D}, 4, dt))};
  };
  auto paths = [](const std::vector<Tensor>& t) {
    AttentionForward f = flash_attention_forward(t[0], t[1], t[2], true, 0.125);
    const AttentionBackend fwd = kernels::last_attention_backend(false);
    flash_attention_backward(t[3], t[0], t[1], t[2], f.out, f.lse, true, 0.125);
    return std::pair{fwd, kernels::last_attention_backend(true)};
  };
  const auto cudnn = std::pair{AttentionBackend::Cudnn, AttentionBackend::Cudnn};
  const auto own = std::pair{AttentionBackend::Own, AttentionBackend::Own};
  {
    ScopedEnv e("TD_CUDNN_ATTENTION", nullptr);
    EXPECT_EQ(paths(inputs(DType::BFloat16, 64)), cudnn);
    EXPECT_EQ(paths(inputs(DType::Float16, 128)), cudnn);
    EXPECT_EQ(paths(inputs(DType::Float32, 64)), own);
    EXPECT_EQ(paths(inputs(DType::BFloat16, 36)), own);
  }
  {
    ScopedEnv e("TD_CUDNN_ATTENTION", "0");
    EXPECT_EQ(paths(inputs(DType::BFloat16, 64)), own);
  }
  {
    ScopedEnv e("TD_CUDNN_ATTENTION", "1");
    EXPECT_EQ(paths(inputs(DType::BFloat16, 128)), cudnn);
    EXPECT_THROW(paths(inputs(DType::Float32, 64)), Error);
    EXPECT_THROW(paths(inputs(DType::BFloat16, 36)), Error);
  }
  {
    ScopedEnv e("TD_CUDNN_ATTENTION", "yes");
    EXPECT_THROW(paths(inputs(DType::BFloat16, 64)), Error);
  }
}

// One lse format: a cuDNN forward's lse drives the own backward and an own forward's lse drives
// cuDNN's backward, each giving the all-cuDNN gradients (within twice the CPU bound).
TEST(AttentionCudnn, MixedPathsAgree) {
  TD_REQUIRE_CUDNN_ATTENTION();
  const Case c{1, 8, 2, 130, 130, 128, true, 0.088};
  const DType dt = DType::BFloat16;
  Tensor q = gpu(randn_seeded({c.B, c.H, c.Tq, c.D}, 40, dt));
  Tensor k = gpu(randn_seeded({c.B, c.Hkv, c.Tk, c.D}, 41, dt));
  Tensor v = gpu(randn_seeded({c.B, c.Hkv, c.Tk, c.D}, 42, dt));
  Tensor g = gpu(randn_seeded({c.B, c.H, c.Tq, c.D}, 43, dt));
  ScopedEnv deflt("TD_CUDNN_ATTENTION", "1");
  const Result ref = run(q, k, v, g, c);
  AttentionForward own_f;
  {
    ScopedEnv off("TD_CUDNN_ATTENTION", "0");
    own_f = flash_attention_forward(q, k, v, c.causal, c.scale);
  }
  expect_close(own_f.lse, ref.f.lse, 1e-5, 2 * kBf16Tol.lse, "lse own vs cuDNN");
  // cuDNN backward from the own forward.
  auto [dq1, dk1, dv1] =
      flash_attention_backward(g, q, k, v, own_f.out, own_f.lse, c.causal, c.scale);
  EXPECT_EQ(kernels::last_attention_backend(true), AttentionBackend::Cudnn);
  // Own backward from the cuDNN forward.
  Tensor dq2, dk2, dv2;
  {
    ScopedEnv off("TD_CUDNN_ATTENTION", "0");
    std::tie(dq2, dk2, dv2) =
        flash_attention_backward(g, q, k, v, ref.f.out, ref.f.lse, c.causal, c.scale);
    EXPECT_EQ(kernels::last_attention_backend(true), AttentionBackend::Own);
  }
  expect_close(dq1, ref.dq, 1e-5, 2 * kBf16Tol.grad, "dq (own fwd, cuDNN bwd)");
  expect_close(dq2, ref.dq, 1e-5, 2 * kBf16Tol.grad, "dq (cuDNN fwd, own bwd)");
  expect_close(dk1, ref.dk, 1e-5, 2 * kBf16Tol.grad, "dk (own fwd, cuDNN bwd)");
  expect_close(dv1, ref.dv, 1e-5, 2 * kBf16Tol.grad, "dv (own fwd, cuDNN bwd)");
  expect_close(dk2, ref.dk, 1e-5, 2 * kBf16Tol.grad, "dk (cuDNN fwd, own bwd)");
  expect_close(dv2, ref.dv, 1e-5, 2 * kBf16Tol.grad, "dv (cuDNN fwd, own bwd)");
}

// The default backward asks cuDNN for its deterministic algorithm: two runs are bitwise equal
// (GQA, so dK/dV sum over query heads). Also through scaled_dot_product_attention's autograd.
TEST(AttentionCudnn, DeterministicAndAutograd) {
  TD_REQUIRE_CUDNN_ATTENTION();
  ScopedEnv deflt("TD_CUDNN_ATTENTION", nullptr);
  ScopedEnv det("TD_CUDNN_ATTENTION_DETERMINISTIC", nullptr);
  const Case c{2, 8, 2, 300, 300, 128, true, 0.09};
  const DType dt = DType::BFloat16;
  Tensor q = gpu(randn_seeded({c.B, c.H, c.Tq, c.D}, 60, dt));
  Tensor k = gpu(randn_seeded({c.B, c.Hkv, c.Tk, c.D}, 61, dt));
  Tensor v = gpu(randn_seeded({c.B, c.Hkv, c.Tk, c.D}, 62, dt));
  Tensor g = gpu(randn_seeded({c.B, c.H, c.Tq, c.D}, 63, dt));
  const Result a = run(q, k, v, g, c), b = run(q, k, v, g, c);
  EXPECT_EQ(a.bwd_path, AttentionBackend::Cudnn)
      << kernels::cudnn_attention_backward_plan(
             {c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.D, c.causal, static_cast<float>(c.scale)},
             kernels::AttentionDType::BFloat16, true)
             .refusal;
  EXPECT_TRUE(same_bytes(host(a.f.out), host(b.f.out)));
  EXPECT_TRUE(same_bytes(host(a.dq), host(b.dq)));
  EXPECT_TRUE(same_bytes(host(a.dk), host(b.dk)));
  EXPECT_TRUE(same_bytes(host(a.dv), host(b.dv)));

  Tensor q1 = q.detach().clone().set_requires_grad(true);
  Tensor k1 = k.detach().clone().set_requires_grad(true);
  Tensor v1 = v.detach().clone().set_requires_grad(true);
  Tensor o = scaled_dot_product_attention(q1, k1, v1, Tensor(), true, c.scale);
  EXPECT_EQ(kernels::last_attention_backend(false), AttentionBackend::Cudnn);
  o.backward(g);
  EXPECT_EQ(kernels::last_attention_backend(true), AttentionBackend::Cudnn);
  EXPECT_TRUE(same_bytes(host(o), host(a.f.out)));
  EXPECT_TRUE(same_bytes(host(q1.grad()), host(a.dq)));
  EXPECT_TRUE(same_bytes(host(k1.grad()), host(a.dk)));
  EXPECT_TRUE(same_bytes(host(v1.grad()), host(a.dv)));
}

#endif  // TD_WITH_CUDA
