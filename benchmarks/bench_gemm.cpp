// td::matmul against a raw oneDNN matmul primitive created here, square M = N = K, fp32 and bf16.
// Prints one JSON line per (dtype, size), plus one with the machine's estimated fp32 peak.
//   ./build/<dir>/benchmarks/bench_gemm
// Both sides use the same OpenMP thread count (OMP_NUM_THREADS, default: all cores).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "tardelli/tardelli.h"

namespace {

using td::bench::median;
using td::bench::now;

// Median seconds of `runs` timed calls of f and of g after `warmup` untimed ones each. The
// calls alternate (f, g, f, g, ...) so that load from other processes hits both alike.
std::pair<double, double> median_times(const std::function<void()>& f,
                                       const std::function<void()>& g, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) {
    f();
    if (g) g();
  }
  std::vector<double> tf, tg;
  for (int i = 0; i < runs; ++i) {
    double t0 = now();
    f();
    tf.push_back(now() - t0);
    if (g) {
      t0 = now();
      g();
      tg.push_back(now() - t0);
    }
  }
  return {median(tf), g ? median(tg) : -1.0};
}

// fp32 FLOP/cycle/core from the ISA (2 FMA pipes x lanes x 2) times cores times the nominal
// clock from /proc/cpuinfo: an upper bound for reference, not a measurement.
void print_peak() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  double mhz = 0;
  bool avx512 = false, fma = false;
  while (std::getline(f, line)) {
    if (mhz == 0 && line.rfind("cpu MHz", 0) == 0) mhz = std::stod(line.substr(line.find(':') + 1));
    if (line.rfind("flags", 0) == 0) {
      avx512 = line.find(" avx512f") != std::string::npos;
      fma = line.find(" fma") != std::string::npos;
    }
  }
  if (mhz == 0 || !fma) return;
  int lanes = avx512 ? 16 : 8;
  int threads = omp_get_max_threads();
  double peak = threads * 2.0 * lanes * 2.0 * mhz * 1e-3;
  std::printf(
      "{\"bench\":\"gemm_peak\",\"threads\":%d,\"mhz\":%.0f,\"isa\":\"%s\","
      "\"fp32_peak_gflops_estimate\":%.1f}\n",
      threads, mhz, avx512 ? "avx512" : "avx2+fma", peak);
}

}  // namespace

int main() {
  using dnnl::memory;
  print_peak();
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  for (td::DType dt : {td::DType::Float32, td::DType::BFloat16}) {
    for (int64_t n : {512, 1024, 2048, 4096}) {
      int runs = n <= 512 ? 15 : n <= 1024 ? 9 : n <= 2048 ? 9 : 3;
      int warmup = 1;
      td::Generator g(1);
      td::Tensor a = td::randn({n, n}, {}, &g).to(dt), b = td::randn({n, n}, {}, &g).to(dt);
      double flop = 2.0 * n * n * n;
      auto run_td = [&] { td::matmul(a, b); };

      // Raw oneDNN on the same buffers (plain row-major), created once outside the timing.
      auto ddt = dt == td::DType::Float32 ? memory::data_type::f32 : memory::data_type::bf16;
      std::string note;
      std::function<void()> run_raw;
      td::Tensor c = td::Tensor::empty({n, n}, dt);
      memory::desc md({n, n}, ddt, memory::format_tag::ab);
      std::unique_ptr<dnnl::matmul> prim;
      memory am, bm, cm;
      try {
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), eng);
        am = memory(md, eng, a.data_ptr());
        bm = memory(md, eng, b.data_ptr());
        cm = memory(md, eng, c.data_ptr());
        prim = std::make_unique<dnnl::matmul>(pd);
        note = pd.impl_info_str();
        run_raw = [&] {
          prim->execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
          strm.wait();
        };
      } catch (const dnnl::error& e) {
        note = std::string("oneDNN has no ") + td::dtype_name(dt) +
               " matmul on this CPU; td::matmul widens to fp32 (fp32 accumulation)";
      }
      auto [t_td, t_raw] = median_times(run_td, run_raw, warmup, runs);
      std::printf(
          "{\"bench\":\"gemm\",\"dtype\":\"%s\",\"M\":%ld,\"N\":%ld,\"K\":%ld,"
          "\"threads\":%d,\"runs\":%d,\"td_ms\":%.3f,\"td_gflops\":%.1f,",
          td::dtype_name(dt), n, n, n, omp_get_max_threads(), runs, t_td * 1e3, flop / t_td * 1e-9);
      if (t_raw > 0) {
        std::printf("\"onednn_ms\":%.3f,\"onednn_gflops\":%.1f,\"td_over_onednn\":%.3f,",
                    t_raw * 1e3, flop / t_raw * 1e-9, t_raw / t_td);
      } else {
        std::printf("\"onednn_ms\":null,\"onednn_gflops\":null,\"td_over_onednn\":null,");
      }
      std::printf("\"onednn_impl\":\"%s\"}\n", note.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
