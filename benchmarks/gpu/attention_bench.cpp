// Fused causal attention on the GPU (kernels/attention/): forward and forward + backward times of
// the launchers td::kernels::attention_forward / attention_backward at B = 8, T = 2048, H = 16,
// D = 128 and 64, bf16, timed with CUDA events (3 warm-up runs, median of 10). One JSON line per
// shape; compare with benchmarks/gpu/torch_sdpa_bench.py (same shapes through torch's SDPA).
// Each shape has a row for Tardelli's own kernels ("path": "tensor_core" or "reference") and
// rows for cuDNN's fused attention (kernels/attention/cudnn_attention.cuh), with the
// deterministic backward the library uses by default ("path": "cudnn") and with the atomics one
// torch uses ("path": "cudnn_nondeterministic"); a shape cuDNN refuses, or a build without the
// cuDNN frontend, prints {"path": "cudnn", "skipped": reason}.
//   ./build/<dir>/benchmarks/gpu/attention_bench
// FLOPs (causal, half of the score matrix): forward 4 B H T^2 D / 2, backward 2.5x the forward.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention/cudnn_attention.cuh"
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
    for (bool det : {true, false}) {
      const char* path = det ? "cudnn" : "cudnn_nondeterministic";
      const auto dt = td::kernels::AttentionDType::BFloat16;
      const td::kernels::CudnnAttentionPlan& fp = td::kernels::cudnn_attention_forward_plan(s, dt);
      const td::kernels::CudnnAttentionPlan& bp =
          td::kernels::cudnn_attention_backward_plan(s, dt, det);
      if (!fp.supported || !bp.supported) {
        std::string why = !fp.supported ? "forward: " + fp.refusal : "backward: " + bp.refusal;
        for (char& ch : why) {
          if (ch == '"' || ch == '\\' || ch == '\n') ch = ' ';
        }
        std::printf(
            "{\"bench\":\"attention\",\"impl\":\"tardelli\",\"path\":\"%s\",\"D\":%ld,"
            "\"skipped\":\"%s\"}\n",
            path, static_cast<long>(D), why.c_str());
        std::fflush(stdout);
        continue;
      }
      void* ws = nullptr;
      const size_t ws_bytes = std::max(fp.workspace_bytes, bp.workspace_bytes);
      if (ws_bytes) TD_BENCH_CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
      auto cfwd = [&] {
        td::kernels::cudnn_attention_forward(q, k, v, out, lse, ws, s, dt, stream);
      };
      auto cfwd_bwd = [&] {
        cfwd();
        td::kernels::cudnn_attention_backward(g, q, k, v, out, lse, dq, dk, dv, ws, s, dt, det,
                                              stream);
      };
      const double cf_ms = td::bench::median_ms(cfwd, stream, 3, 10);
      const double cfb_ms = td::bench::median_ms(cfwd_bwd, stream, 3, 10);
      const double cb_ms = cfb_ms - cf_ms;
      std::printf(
          "{\"bench\":\"attention\",\"impl\":\"tardelli\",\"path\":\"%s\",\"device\":\"%s\","
          "\"dtype\":\"bf16\",\"causal\":true,\"B\":%ld,\"T\":%ld,\"H\":%ld,\"D\":%ld,"
          "\"fwd_ms\":%.3f,\"fwd_bwd_ms\":%.3f,\"bwd_ms\":%.3f,\"fwd_tflops\":%.1f,"
          "\"bwd_tflops\":%.1f,\"fwd_bwd_tflops\":%.1f,\"workspace_bytes\":%zu}\n",
          path, prop.name, static_cast<long>(B), static_cast<long>(T), static_cast<long>(H),
          static_cast<long>(D), cf_ms, cfb_ms, cb_ms, fwd_flop / cf_ms * 1e-9,
          bwd_flop / cb_ms * 1e-9, (fwd_flop + bwd_flop) / cfb_ms * 1e-9, ws_bytes);
      std::fflush(stdout);
      if (ws) TD_BENCH_CHECK_CUDA(cudaFree(ws));
    }
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
