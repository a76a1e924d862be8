// Causal attention forward + backward: the fused (flash) path against the composite path that
// materializes the scores (taken when a mask is passed; here the same causal mask as a bool
// tensor). One JSON line per (dtype, T, path) with times, achieved GFLOP/s and peak memory.
//   ./build/<dir>/benchmarks/bench_attention
// FLOPs counted as torch does for causal attention: forward 4*B*H*T*T*D/2 (two GEMMs over the
// lower triangle), backward 2.5x the forward.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench_util.h"
#include "tardelli/tardelli.h"

namespace {

using td::bench::median;
using td::bench::now;

}  // namespace

int main() {
  const int64_t B = 4, H = 8, D = 64;
  for (td::DType dt : {td::DType::Float32, td::DType::BFloat16}) {
    for (int64_t T : {512, 1024}) {
      td::Generator gen(1);
      td::Tensor q = td::randn({B, H, T, D}, {}, &gen).to(dt).set_requires_grad(true);
      td::Tensor k = td::randn({B, H, T, D}, {}, &gen).to(dt).set_requires_grad(true);
      td::Tensor v = td::randn({B, H, T, D}, {}, &gen).to(dt).set_requires_grad(true);
      td::Tensor g = td::randn({B, H, T, D}, {}, &gen).to(dt);
      std::vector<bool> keep(T * T);
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = 0; j < T; ++j) keep[i * T + j] = j <= i;
      }
      td::Tensor mask = td::from_vector<bool>(keep, {T, T});
      const double fwd_flop = 4.0 * B * H * T * T * D / 2, bwd_flop = 2.5 * fwd_flop;
      for (const char* path : {"flash", "composite"}) {
        bool flash = path[0] == 'f';
        const int runs = flash ? 5 : 3;
        std::vector<double> tf, tb;
        int64_t peak = 0;
        for (int it = 0; it < runs + 1; ++it) {  // the first run is warm-up
          q.set_grad(td::Tensor());
          k.set_grad(td::Tensor());
          v.set_grad(td::Tensor());
          td::reset_peak_memory_stats();
          int64_t base = td::memory_stats().current_bytes;
          double t0 = now();
          td::Tensor out = flash ? td::scaled_dot_product_attention(q, k, v, td::Tensor(), true)
                                 : td::scaled_dot_product_attention(q, k, v, mask);
          double t1 = now();
          out.backward(g);
          double t2 = now();
          peak = std::max(peak, td::memory_stats().peak_bytes - base);
          if (it > 0) {
            tf.push_back(t1 - t0);
            tb.push_back(t2 - t1);
          }
        }
        double f = median(tf), b = median(tb);
        std::printf(
            "{\"bench\":\"attention\",\"path\":\"%s\",\"dtype\":\"%s\",\"causal\":true,"
            "\"B\":%ld,\"H\":%ld,\"T\":%ld,\"D\":%ld,\"threads\":%d,\"fwd_ms\":%.2f,"
            "\"bwd_ms\":%.2f,\"fwd_gflops\":%.1f,\"bwd_gflops\":%.1f,"
            "\"peak_mib\":%.1f}\n",
            path, td::dtype_name(dt), B, H, T, D, omp_get_max_threads(), f * 1e3, b * 1e3,
            fwd_flop / f * 1e-9, bwd_flop / b * 1e-9, static_cast<double>(peak) / (1 << 20));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
