// Memory-bound ops against the machine's limit: each result is bytes moved (read + written)
// per second, and that as a fraction of a 2-thread memcpy over buffers of the same size.
//
//   build/cpu/benchmarks/bench_elementwise            # 32M elements, 10 timed runs each
//   build/cpu/benchmarks/bench_elementwise --quick    # 4M elements, 3 runs (a smoke test)
//   OMP_NUM_THREADS=1 build/cpu/benchmarks/bench_elementwise   # one core
//
// Prints one JSON object per line: {"bench", "dtype", "shape", "bytes", "ms" (median),
// "ms_best", "gbps" (from the median), "frac_memcpy", "threads", "note"}.
//
// Note [Fresh outputs]: out-of-place ops allocate their result on every call. Blocks this
// large come from mmap, so every call also pays page faults on a fresh, zeroed buffer; the
// in-place rows (add_) and "zeros" (allocation + first write alone) separate that cost from
// the loop itself.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tardelli/tardelli.h"

namespace {

struct Config {
  int64_t n = int64_t{32} << 20;  // elements: 128 MiB per fp32 buffer, well past the 32 MiB L3
  int64_t ln_rows = 8192, ln_cols = 1024;
  int reps = 10;
};

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

struct Timing {
  double median_ms, best_ms;
};

// One untimed warm-up call, then `reps` timed calls.
Timing time_it(int reps, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_ms();
    f();
    t.push_back(now_ms() - t0);
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t[0]};
}

std::string shape_json(const td::Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

double g_memcpy_gbps = 0.0;

void report(const char* bench, const char* dtype, const td::Shape& shape, double bytes, Timing t,
            const char* note = "") {
  double gbps = bytes / (t.median_ms * 1e-3) / 1e9;
  double frac = g_memcpy_gbps > 0 ? gbps / g_memcpy_gbps : 1.0;
  std::printf(
      "{\"bench\": \"%s\", \"dtype\": \"%s\", \"shape\": %s, \"bytes\": %.0f, \"ms\": %.3f, "
      "\"ms_best\": %.3f, \"gbps\": %.2f, \"frac_memcpy\": %.3f, \"threads\": %d, "
      "\"note\": \"%s\"}\n",
      bench, dtype, shape_json(shape).c_str(), bytes, t.median_ms, t.best_ms, gbps, frac,
      omp_get_max_threads(), note);
  std::fflush(stdout);
}

// memcpy split across the OpenMP threads: the most any read+write loop can hope for.
void bench_memcpy(const Config& c) {
  const size_t nbytes = static_cast<size_t>(c.n) * sizeof(float);
  td::Tensor src = td::ones({c.n}), dst = td::zeros({c.n});
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  Timing t = time_it(c.reps, [&] {
#pragma omp parallel
    {
      size_t nt = static_cast<size_t>(omp_get_num_threads());
      size_t tid = static_cast<size_t>(omp_get_thread_num());
      size_t chunk = (nbytes + nt - 1) / nt;
      size_t b = std::min(nbytes, tid * chunk), e = std::min(nbytes, b + chunk);
      std::memcpy(d + b, s + b, e - b);
    }
  });
  g_memcpy_gbps = 2.0 * static_cast<double>(nbytes) / (t.median_ms * 1e-3) / 1e9;
  report("memcpy", "float32", {c.n}, 2.0 * static_cast<double>(nbytes), t,
         "reference: preallocated buffers");
}

void bench_dtype(const Config& c, td::DType dt) {
  const char* name = td::dtype_name(dt);
  const double isz = static_cast<double>(td::itemsize(dt));
  const double n = static_cast<double>(c.n);
  td::TensorOptions o{.dtype = dt};
  td::Tensor a = td::randn({c.n}, o), b = td::randn({c.n}, o);

  report("zeros", name, {c.n}, n * isz, time_it(c.reps, [&] { (void)td::zeros({c.n}, o); }),
         "allocation + first write of a fresh buffer");
  report("add", name, {c.n}, 3 * n * isz, time_it(c.reps, [&] { (void)td::add(a, b); }),
         "out = a + b, fresh output");
  td::Tensor acc = a.clone();
  report("add_", name, {c.n}, 3 * n * isz, time_it(c.reps, [&] { td::add_(acc, b, 1e-3); }),
         "a += alpha*b in place");
  report("gelu", name, {c.n}, 2 * n * isz, time_it(c.reps, [&] { (void)td::gelu(a); }),
         "erf form, fresh output");
  report("gelu_tanh", name, {c.n}, 2 * n * isz,
         time_it(c.reps, [&] { (void)td::gelu(a, td::GeluApprox::Tanh); }),
         "tanh form, fresh output");
  report("gelu_tanh_and_backward", name, {c.n}, 4 * n * isz,
         time_it(c.reps, [&] { (void)td::gelu_and_backward(b, a, td::GeluApprox::Tanh); }),
         "fused: reads x and grad, writes y and dx (the MLP's backward)");

  const int64_t cols = 1024, rows = c.n / cols;
  td::Tensor m = a.view({rows, cols});
  td::Tensor row = td::randn({cols}, o);
  report("add_broadcast", name, {rows, cols}, 2 * n * isz + cols * isz,
         time_it(c.reps, [&] { (void)td::add(m, row); }), "[R, 1024] + [1024], fresh output");

  td::Tensor w = td::randn({c.ln_cols}, o), bias = td::randn({c.ln_cols}, o);
  for (int64_t r : {c.ln_rows, 4 * c.ln_rows}) {
    td::Tensor x = td::randn({r, c.ln_cols}, o);
    const double xb = static_cast<double>(r * c.ln_cols) * isz;
    report("layer_norm", name, {r, c.ln_cols}, 2 * xb + 2 * c.ln_cols * isz,
           time_it(c.reps, [&] { (void)td::layer_norm(x, {c.ln_cols}, w, bias); }),
           "forward with weight and bias, fresh output");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      c.n = int64_t{4} << 20;
      c.ln_rows = 1024;
      c.reps = 3;
    } else {
      std::fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
      return 2;
    }
  }
  try {
    td::manual_seed(0);
    bench_memcpy(c);
    bench_dtype(c, td::DType::Float32);
    bench_dtype(c, td::DType::BFloat16);
  } catch (const td::Error& e) {
    std::fprintf(stderr, "bench_elementwise: %s\n", e.what());
    return 1;
  }
  return 0;
}
