// Fused causal attention on the GPU (kernels/attention/): forward and forward + backward times of
// the launchers td::kernels::attention_forward / attention_backward at B = 8, T = 2048, H = 16,
// D = 128 and 64, bf16, timed with CUDA events (3 warm-up runs, median of 10). One JSON line per
// shape; compare with benchmarks/gpu/torch_sdpa_bench.py (same shapes through torch's SDPA).
//   ./build/<dir>/benchmarks/gpu/attention_bench
// FLOPs (causal, half of the score matrix): forward 4 B H T^2 D / 2, backward 2.5x the forward.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attention/flash_attention.cuh"
#include "bench_util.h"

namespace {

using bf16 = __nv_bfloat16;

bf16* device_random(size_t n, uint32_t seed) {
  std::vector<bf16> h(n);
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (auto& x : h) x = __float2bfloat16(dist(gen));
  bf16* d = nullptr;
  TD_BENCH_CHECK_CUDA(cudaMalloc(&d, n * sizeof(bf16)));
  TD_BENCH_CHECK_CUDA(cudaMemcpy(d, h.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

int main() {
  if (td::bench::skip_without_cuda("attention")) return 0;
  cudaDeviceProp prop{};
  TD_BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  TD_BENCH_CHECK_CUDA(cudaStreamCreate(&stream));
  const int64_t B = 8, T = 2048, H = 16;
  for (int64_t D : {128, 64}) {
    td::kernels::AttentionShape s;
    s.B = B;
    s.H = s.Hkv = H;
    s.Tq = s.Tk = T;
    s.D = s.Dv = D;
    s.causal = true;
    s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    const size_t n = static_cast<size_t>(B * H * T * D), rows = static_cast<size_t>(B * H * T);
    bf16 *q = device_random(n, 1), *k = device_random(n, 2), *v = device_random(n, 3),
         *g = device_random(n, 4);
    bf16 *out, *dq, *dk, *dv;
    float *lse, *delta;
    for (bf16** p : {&out, &dq, &dk, &dv}) TD_BENCH_CHECK_CUDA(cudaMalloc(p, n * sizeof(bf16)));
    TD_BENCH_CHECK_CUDA(cudaMalloc(&lse, rows * sizeof(float)));
    TD_BENCH_CHECK_CUDA(cudaMalloc(&delta, rows * sizeof(float)));
    const bool tc = td::kernels::attention_uses_tensor_cores<bf16>(s, q, k, v, out);
    auto fwd = [&] { td::kernels::attention_forward<bf16>(q, k, v, out, lse, s, stream); };
    auto fwd_bwd = [&] {
      fwd();
      td::kernels::attention_backward<bf16>(g, q, k, v, out, lse, dq, dk, dv, delta, s, stream);
    };
    const double f_ms = td::bench::median_ms(fwd, stream, 3, 10);
    const double fb_ms = td::bench::median_ms(fwd_bwd, stream, 3, 10);
    const double fwd_flop = 4.0 * B * H * T * T * D / 2;
    const double bwd_flop = 2.5 * fwd_flop;
    const double b_ms = fb_ms - f_ms;
    std::printf(
        "{\"bench\":\"attention\",\"impl\":\"tardelli\",\"path\":\"%s\",\"device\":\"%s\","
        "\"dtype\":\"bf16\",\"causal\":true,\"B\":%ld,\"T\":%ld,\"H\":%ld,\"D\":%ld,"
        "\"fwd_ms\":%.3f,\"fwd_bwd_ms\":%.3f,\"bwd_ms\":%.3f,\"fwd_tflops\":%.1f,"
        "\"bwd_tflops\":%.1f,\"fwd_bwd_tflops\":%.1f}\n",
        tc ? "tensor_core" : "reference", prop.name, static_cast<long>(B), static_cast<long>(T),
        static_cast<long>(H), static_cast<long>(D), f_ms, fb_ms, b_ms, fwd_flop / f_ms * 1e-9,
        bwd_flop / b_ms * 1e-9, (fwd_flop + bwd_flop) / fb_ms * 1e-9);
    std::fflush(stdout);
    for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                    static_cast<void*>(g), static_cast<void*>(out), static_cast<void*>(dq),
                    static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(lse),
                    static_cast<void*>(delta)}) {
      TD_BENCH_CHECK_CUDA(cudaFree(p));
    }
  }
  TD_BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
