#pragma once
// Helpers shared by the GPU benchmarks (header-only): the skip line without a device, failing
// with a JSON error line on a CUDA error, and CUDA-event timing (median of samples).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace td::bench {

// The "bench" field of every line this process prints (set by skip_without_cuda).
inline const char*& bench_name() {
  static const char* name = "unknown";
  return name;
}

// Prints {"bench":..,"error":what} (quotes and backslashes turned into ', newlines into spaces,
// so the line stays valid JSON) and exits with status 1.
[[noreturn]] inline void fail(std::string what) {
  for (char& ch : what) {
    if (ch == '"' || ch == '\\') ch = '\'';
    if (ch == '\n') ch = ' ';
  }
  std::printf("{\"bench\":\"%s\",\"error\":\"%s\"}\n", bench_name(), what.c_str());
  std::exit(1);
}

// Names the benchmark; without a CUDA device prints {"bench":name,"skipped":"no CUDA device"} and
// returns true (main then returns 0).
inline bool skip_without_cuda(const char* name) {
  bench_name() = name;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("{\"bench\":\"%s\",\"skipped\":\"no CUDA device\"}\n", name);
    return true;
  }
  return false;
}

}  // namespace td::bench

#define TD_BENCH_CHECK_CUDA(call)                                                                 \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) ::td::bench::fail(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

namespace td::bench {

// Milliseconds per call of f on `stream`: `warmup` untimed calls and a device synchronize, then
// `samples` samples (CUDA events around `reps` back-to-back calls each, divided by reps); the
// median sample (the mean of the middle two for an even count).
template <typename F>
double median_ms(F&& f, cudaStream_t stream = 0, int warmup = 3, int samples = 20, int reps = 1) {
  cudaEvent_t start, stop;
  TD_BENCH_CHECK_CUDA(cudaEventCreate(&start));
  TD_BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) f();
  TD_BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int s = 0; s < samples; ++s) {
    TD_BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    for (int r = 0; r < reps; ++r) f();
    TD_BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    TD_BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    TD_BENCH_CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(static_cast<double>(t) / reps);
  }
  TD_BENCH_CHECK_CUDA(cudaEventDestroy(start));
  TD_BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

}  // namespace td::bench
