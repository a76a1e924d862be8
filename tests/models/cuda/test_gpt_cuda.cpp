// The fused GPT on the CUDA backend against the same model on the CPU backend: one training
// step end to end (every op the model uses, forward and backward, and the AdamW update) for
// both architectures, fp32 and bf16 compute. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "ops/cuda/cuda_test_util.h"
#include "tardelli/models/gpt.h"
#include "tardelli/tardelli.h"

using namespace td;
using td::models::Arch;
using td::models::GPT;
using td::models::GPTConfig;

namespace {

GPTConfig config(Arch arch, DType dtype) {
  GPTConfig c;
  c.arch = arch;
  c.vocab_size = 301;  // not a multiple of any vector width or tile
  c.block_size = 80;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = arch == Arch::Llama ? 2 : 0;
  c.d_model = 256;  // head dim 64: the tensor-core attention path in bf16
  c.dtype = dtype;
  c.seed = 11;
  return c;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, {DType::Int64, kCPU, false}, &g);
}

// max|a - b| / max(max|b|, floor): normwise, as the conformance tests measure.
double normwise(const Tensor& a, const Tensor& b, double floor = 1e-3) {
  std::vector<float> x = to_vector<float>(a), y = to_vector<float>(b);
  EXPECT_EQ(x.size(), y.size());
  double err = 0, scale = floor;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(y[i])));
  }
  return err / scale;
}

// One forward (the loss within loss_tol relative) and backward (every gradient within grad_tol
// normwise) of the same batch on the CPU model and its copy on the GPU; the GPU's parameters
// by name.
std::map<std::string, Tensor> compare_forward_backward(GPT& cpu, GPT& gpu, double loss_tol,
                                                       double grad_tol) {
  for (auto& [n, p] : gpu.named_parameters()) EXPECT_TRUE(p.is_cuda()) << n;
  const Tensor idx = tokens(3, 80, 301, 5), tgt = tokens(3, 80, 301, 6);
  Tensor loss_cpu = cpu.forward(idx, tgt);
  Tensor loss_gpu = gpu.forward(idx.to(cuda_device(0)), tgt.to(cuda_device(0)));
  EXPECT_TRUE(loss_gpu.is_cuda());
  EXPECT_NEAR(loss_gpu.item<double>(), loss_cpu.item<double>(),
              loss_tol * std::fabs(loss_cpu.item<double>()));
  loss_cpu.backward();
  loss_gpu.backward();
  std::map<std::string, Tensor> gp;
  for (auto& [n, p] : gpu.named_parameters()) gp[n] = p;
  for (auto& [n, p] : cpu.named_parameters()) {
    EXPECT_TRUE(gp[n].grad().defined()) << n;
    if (gp[n].grad().defined()) {
      EXPECT_LT(normwise(gp[n].grad(), p.grad()), grad_tol) << "gradient of " << n;
    }
  }
  return gp;
}

void check_step(Arch arch, DType dtype, double loss_tol, double grad_tol) {
  TD_REQUIRE_CUDA();
  GPT cpu(config(arch, dtype)), gpu(config(arch, dtype));
  gpu.to(cuda_device(0));
  std::map<std::string, Tensor> gp = compare_forward_backward(cpu, gpu, loss_tol, grad_tol);
  if (::testing::Test::HasFailure()) return;
  // eps 1e-3: with 1e-8, Adam's first step turns pure rounding noise (gpt2's key-bias gradients
  // are exactly 0 in exact arithmetic) into full lr-sized steps of random sign.
  const optim::AdamWOptions o{.lr = 1e-3, .eps = 1e-3};
  optim::AdamW opt_cpu(cpu.parameters(), o), opt_gpu(gpu.parameters(), o);
  opt_cpu.step();
  opt_gpu.step();
  // Adam's first step moves p by -lr * g / (|g| + eps) (the decay term is the same on both), a
  // function of g alone with slope at most lr / eps. So each parameter may differ by lr / eps
  // times the difference of its two gradients, plus the fp32 rounding of the update and of p
  // (a few ulps of |p| + lr). A normwise bound would not do: zero-initialised biases are the
  // update itself, so their relative error is the gradients' relative error of small entries.
  const double slope = o.lr / o.eps, ulp = std::ldexp(1.0, -23);
  for (auto& [n, p] : cpu.named_parameters()) {
    const std::vector<float> pc = to_vector<float>(p), pg = to_vector<float>(gp[n]);
    const std::vector<float> gc = to_vector<float>(p.grad()), gg = to_vector<float>(gp[n].grad());
    ASSERT_EQ(pc.size(), pg.size());
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < pc.size(); ++i) {
      const double bound = slope * std::fabs(static_cast<double>(gg[i]) - gc[i]) +
                           4 * ulp * (std::fabs(pc[i]) + o.lr);
      if (!(std::fabs(static_cast<double>(pg[i]) - pc[i]) <= bound)) {
        if (bad++ == 0) first = static_cast<int64_t>(i);
      }
    }
    EXPECT_EQ(bad, 0) << "parameter " << n << " after AdamW: " << bad << " elements off, first "
                      << first << " (gpu " << (first >= 0 ? pg[first] : 0.f) << ", cpu "
                      << (first >= 0 ? pc[first] : 0.f) << ")";
  }
}

}  // namespace

// fp32: the GPU sums in other orders (cuBLASLt tiles, block reductions, attention tiles) and its
// expf/tanhf differ by ulps, so results agree to a few fp32 ulps of the largest value per op,
// accumulated through 2 layers: 1e-5 on the loss, 1e-4 on gradients (normwise); the AdamW
// update is checked elementwise against the gradient differences (check_step).
TEST(GPTCuda, Gpt2Fp32StepMatchesCpu) {
  check_step(Arch::GPT2, DType::Float32, 1e-5, 1e-4);
}
TEST(GPTCuda, LlamaFp32StepMatchesCpu) {
  check_step(Arch::Llama, DType::Float32, 1e-5, 1e-4);
}
// bf16 compute: activations are rounded to 8 mantissa bits (2^-9 relative) at every op on both
// backends, at different points (the GPU keeps attention probabilities and GEMM accumulators in
// fp32), so losses agree to ~1e-2 and gradients to a few percent of their largest entry; the
// fp32 master parameters are checked against the gradient differences as in fp32.
TEST(GPTCuda, Gpt2Bf16StepMatchesCpu) {
  check_step(Arch::GPT2, DType::BFloat16, 1e-2, 8e-2);
}
TEST(GPTCuda, LlamaBf16StepMatchesCpu) {
  check_step(Arch::Llama, DType::BFloat16, 1e-2, 8e-2);
}

// FP8 blocks (GPT::set_fp8, current scaling) on the GPU: quantization, cuBLASLt's FP8 GEMMs
// (d_model 256, 4 d_model 1024 and the 240 rows are multiples of 16) against the CPU's exact
// emulation. Activations entering a quantization differ by fp32 rounding (~1e-6 relative), so
// now and then a value within that distance of a rounding boundary takes the neighbouring FP8
// code on one side: one term of one product moves by up to an e4m3 ulp (1/8 of itself) while
// thousands of terms are summed. The loss agrees to 1e-3 relative and gradients to 5e-2
// normwise, an order of magnitude above what a few such flips produce.
TEST(GPTCuda, Gpt2Fp8StepMatchesCpu) {
  TD_REQUIRE_CUDA();
  GPT cpu(config(Arch::GPT2, DType::Float32)), gpu(config(Arch::GPT2, DType::Float32));
  cpu.set_fp8(/*history=*/0, /*margin=*/0.0);
  gpu.set_fp8(/*history=*/0, /*margin=*/0.0);
  gpu.to(cuda_device(0));
  cpu.train();
  gpu.train();
  compare_forward_backward(cpu, gpu, 1e-3, 5e-2);
}

// Greedy generation (top_k 1) with the KV cache on the GPU picks the same tokens as on the CPU:
// the logits agree to fp32 rounding, far below the gap between the two best tokens of a random
// model's ~300-way distribution (a near-tie could flip a token; with 6 tokens x 2 rows it has
// not been seen). The result lives on the prompt's device.
TEST(GPTCuda, GreedyGenerationMatchesCpu) {
  TD_REQUIRE_CUDA();
  for (Arch arch : {Arch::GPT2, Arch::Llama}) {
    GPT cpu(config(arch, DType::Float32)), gpu(config(arch, DType::Float32));
    gpu.to(cuda_device(0));
    const Tensor prompt = tokens(2, 5, 301, 9);
    Generator g1(3), g2(3);
    Tensor a = cpu.generate(prompt, 6, 1.0, 1, &g1);
    Tensor b = gpu.generate(prompt.to(cuda_device(0)), 6, 1.0, 1, &g2);
    ASSERT_TRUE(b.is_cuda());
    EXPECT_EQ(to_vector<int64_t>(a), to_vector<int64_t>(b));
  }
}
