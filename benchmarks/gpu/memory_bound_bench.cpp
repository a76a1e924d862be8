// Memory-bound kernels on the GPU against the device's own copy bandwidth: layer_norm and rms_norm
// forward and backward (with dweight / dbias), softmax forward and backward, gelu forward and
// backward (launchers of kernels/norm, kernels/softmax, kernels/activation at [16384, 4096] and
// at GPT-2's [8192, 768], bf16 and fp32) and AdamW (td::adamw_step on 100 fp32 tensors of 1M
// parameters each). Each op's GB/s counts the bytes it must read and write once (layer_norm bwd:
// g and x read, dx written; AdamW: param, grad and both moments read, three written: 28 bytes a
// parameter) and stands next to a device-to-device cudaMemcpyAsync moving the same total bytes
// (half read, half written) timed in the same run. CUDA events, 3 warm-up runs, median of 20.
// One JSON line per op, dtype and shape:
//   {"bench":"memory_bound","op":..,"dtype":..,"rows":..,"n":..,"gbps":..,"copy_gbps":..,"ratio":..}
//   ./build/<dir>/benchmarks/gpu/memory_bound_bench
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "activation/activation.cuh"
#include "bench_util.h"
#include "norm/norm.cuh"
#include "softmax/softmax.cuh"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/error.h"
#include "tardelli/ops/adamw.h"
#include "tardelli/ops/factory.h"

namespace {

using td::bench::median_ms;

// GB/s of a device-to-device copy moving `bytes` in all (bytes / 2 read and bytes / 2 written).
double copy_gbps(size_t bytes) {
  const size_t half = bytes / 2;
  void *src = nullptr, *dst = nullptr;
  TD_BENCH_CHECK_CUDA(cudaMalloc(&src, half));
  TD_BENCH_CHECK_CUDA(cudaMalloc(&dst, half));
  TD_BENCH_CHECK_CUDA(cudaMemset(src, 0, half));
  const double ms = median_ms(
      [&] { TD_BENCH_CHECK_CUDA(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice, 0)); });
  TD_BENCH_CHECK_CUDA(cudaFree(src));
  TD_BENCH_CHECK_CUDA(cudaFree(dst));
  return 2.0 * static_cast<double>(half) / (ms * 1e6);
}

// rows / n: the op's [rows, n] shape (0 for AdamW).
void report(const char* op, const char* dtype, int64_t rows, int64_t n, size_t bytes, double ms) {
  const double gbps = static_cast<double>(bytes) / (ms * 1e6), copy = copy_gbps(bytes);
  std::printf(
      "{\"bench\":\"memory_bound\",\"op\":\"%s\",\"dtype\":\"%s\",\"rows\":%lld,\"n\":%lld,"
      "\"bytes\":%zu,\"ms\":%.4f,\"gbps\":%.1f,\"copy_gbps\":%.1f,\"ratio\":%.3f}\n",
      op, dtype, static_cast<long long>(rows), static_cast<long long>(n), bytes, ms, gbps, copy,
      gbps / copy);
  std::fflush(stdout);
}

template <typename T>
T* device_buffer(size_t n, float value) {
  T* p = nullptr;
  TD_BENCH_CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  // Non-trivial contents: fill with a pattern through a host staging buffer.
  std::vector<T> h(std::min<size_t>(n, size_t{1} << 20));
  for (size_t i = 0; i < h.size(); ++i) {
    h[i] = static_cast<T>(value * static_cast<float>((i * 2654435761u) % 1000) / 500.0f - value);
  }
  for (size_t off = 0; off < n; off += h.size()) {
    const size_t c = std::min(h.size(), n - off);
    TD_BENCH_CHECK_CUDA(cudaMemcpy(p + off, h.data(), c * sizeof(T), cudaMemcpyHostToDevice));
  }
  return p;
}

template <typename T>
void bench_dtype(const char* dtype, int64_t rows, int64_t n, bool with_gelu) {
  const size_t numel = static_cast<size_t>(rows * n), tb = numel * sizeof(T);
  T* x = device_buffer<T>(numel, 2.0f);
  T* g = device_buffer<T>(numel, 1.0f);
  T* y = device_buffer<T>(numel, 0.0f);
  float* w = device_buffer<float>(static_cast<size_t>(n), 1.0f);
  float* b = device_buffer<float>(static_cast<size_t>(n), 0.5f);
  float *mean = nullptr, *rstd = nullptr, *dw = nullptr, *db = nullptr;
  TD_BENCH_CHECK_CUDA(cudaMalloc(&mean, rows * sizeof(float)));
  TD_BENCH_CHECK_CUDA(cudaMalloc(&rstd, rows * sizeof(float)));
  TD_BENCH_CHECK_CUDA(cudaMalloc(&dw, n * sizeof(float)));
  TD_BENCH_CHECK_CUDA(cudaMalloc(&db, n * sizeof(float)));
  void* scratch = nullptr;
  TD_BENCH_CHECK_CUDA(
      cudaMalloc(&scratch, td::kernels::norm_backward_scratch_bytes(rows, n, true, true)));
  const cudaStream_t s = 0;

  // with_gelu: the elementwise rows, which do not depend on the shape, at the first shape only.
  auto rep = [&](const char* op, size_t bytes, double ms) {
    report(op, dtype, rows, n, bytes, ms);
  };
  rep("layer_norm_fwd", 2 * tb, median_ms([&] {
        td::kernels::norm_forward<T>(x, y, mean, rstd, w, b, rows, n, 1e-5f, true, s);
      }));
  rep("layer_norm_bwd", 3 * tb, median_ms([&] {
        td::kernels::norm_backward<T>(g, x, mean, rstd, w, y, dw, db, rows, n, scratch, s);
      }));
  rep("rms_norm_fwd", 2 * tb, median_ms([&] {
        td::kernels::norm_forward<T>(x, y, nullptr, rstd, w, nullptr, rows, n, 1e-5f, false, s);
      }));
  rep("rms_norm_bwd", 3 * tb, median_ms([&] {
        td::kernels::norm_backward<T>(g, x, nullptr, rstd, w, y, dw, nullptr, rows, n, scratch, s);
      }));
  rep("softmax_fwd", 2 * tb,
      median_ms([&] { td::kernels::softmax_forward<T>(x, y, rows, n, false, s); }));
  rep("softmax_bwd", 3 * tb,
      median_ms([&] { td::kernels::softmax_backward<T>(g, x, y, rows, n, false, s); }));
  if (with_gelu) {
    rep("gelu_fwd", 2 * tb, median_ms([&] {
          td::kernels::activation_forward<T>(td::kernels::ActivationOp::GeluTanh, x, y,
                                             static_cast<int64_t>(numel), s);
        }));
    rep("gelu_bwd", 3 * tb, median_ms([&] {
          td::kernels::activation_backward<T>(td::kernels::ActivationOp::GeluTanh, g, x, y,
                                              static_cast<int64_t>(numel), s);
        }));
  }
  for (void* p :
       {static_cast<void*>(x), static_cast<void*>(g), static_cast<void*>(y), static_cast<void*>(w),
        static_cast<void*>(b), static_cast<void*>(mean), static_cast<void*>(rstd),
        static_cast<void*>(dw), static_cast<void*>(db), scratch}) {
    TD_BENCH_CHECK_CUDA(cudaFree(p));
  }
}

void bench_adamw() {
  constexpr int kTensors = 100;
  constexpr int64_t kEach = int64_t{1} << 20;
  try {
    const td::TensorOptions o{td::DType::Float32, td::cuda_device(0), false};
    td::TensorList p, g, m, v;
    for (int i = 0; i < kTensors; ++i) {
      p.push_back(td::full({kEach}, 0.5, o));
      g.push_back(td::full({kEach}, 0.01, o));
      m.push_back(td::zeros({kEach}, o));
      v.push_back(td::zeros({kEach}, o));
    }
    td::AdamWConfig cfg;
    td::cuda_synchronize();
    const size_t bytes = static_cast<size_t>(kTensors) * kEach * 4 * 7;
    report("adamw", "float32", 0, 0, bytes, median_ms([&] { td::adamw_step(p, g, m, v, cfg); }));
  } catch (const td::Error& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '"', '\'');
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::printf("{\"bench\":\"memory_bound\",\"op\":\"adamw\",\"skipped\":\"%s\"}\n", msg.c_str());
  }
}

}  // namespace

int main() {
  if (td::bench::skip_without_cuda("memory_bound")) return 0;
  constexpr int64_t kRows = 16384, kN = 4096;      // the shape
  constexpr int64_t kGptRows = 8192, kGptN = 768;  // GPT-2 small: 8 x 1024 tokens, d_model 768
  bench_dtype<__nv_bfloat16>("bfloat16", kRows, kN, true);
  bench_dtype<float>("float32", kRows, kN, true);
  bench_dtype<__nv_bfloat16>("bfloat16", kGptRows, kGptN, false);
  bench_dtype<float>("float32", kGptRows, kGptN, false);
  bench_adamw();
  return 0;
}
