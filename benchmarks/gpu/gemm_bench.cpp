// GEMM throughput of td::mm on CUDA tensors (kernels/gemm: cuBLASLt behind the Tensor API, with
// its descriptor/heuristic cache and a caching-allocator workspace) against cuBLASLt called
// directly here (own handle, descriptors, first heuristic, 32 MiB workspace) on the same
// buffers: bf16 and fp16 at 4096^3 and 8192^3, fp32 with TF32 at 4096^3. Row-major C = A B.
// Then FP8 against bf16 (fp8_cases).
//   ./build/<dir>/benchmarks/gpu/gemm_bench
// One JSON line per case; "ratio" is td / raw cuBLASLt throughput (target: >= 0.95 for bf16).
// Timing: CUDA events around `reps` back-to-back calls (so host work overlaps the GPU, as in
// training), 5 warm-up calls, median of 20 samples. FLOPs = 2 M N K. The peak is the dense
// tensor-core peak assumed from the compute capability (printed as "peak_assumption").
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gemm/gemm.cuh"
#include "runtime/stream.cuh"
#include "tardelli/tardelli.h"

namespace {

using td::bench::fail;

#define CHECK_LT(call)                                                          \
  do {                                                                          \
    const cublasStatus_t s_ = (call);                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                            \
      ::td::bench::fail(std::string(#call) + ": status " + std::to_string(s_)); \
  } while (0)

constexpr size_t kRawWorkspace = size_t{32} << 20;

// Plain cuBLASLt for row-major C[M,N] = A[M,K] B[K,N]: C^T = B^T A^T in column-major terms.
class RawGemm {
 public:
  RawGemm(cudaDataType_t type, cublasComputeType_t compute, int64_t m, int64_t n, int64_t k) {
    CHECK_LT(cublasLtCreate(&handle_));
    CHECK_LT(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F));
    const cublasOperation_t op = CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof(op)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof(op)));
    CHECK_LT(cublasLtMatrixLayoutCreate(&la_, type, n, k, n));  // B^T: n x k, ld n
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb_, type, k, m, k));  // A^T: k x m, ld k
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc_, type, n, m, n));  // C^T: n x m, ld n
    TD_BENCH_CHECK_CUDA(cudaMalloc(&workspace_, kRawWorkspace));
    cublasLtMatmulPreference_t pref = nullptr;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kRawWorkspace;
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, la_, lb_, lc_, lc_, pref, 1, &result,
                                            &returned));
    CHECK_LT(cublasLtMatmulPreferenceDestroy(pref));
    if (returned == 0) fail("raw cuBLASLt: no algorithm");
    algo_ = result.algo;
  }
  ~RawGemm() {
    cudaFree(workspace_);
    cublasLtMatrixLayoutDestroy(la_);
    cublasLtMatrixLayoutDestroy(lb_);
    cublasLtMatrixLayoutDestroy(lc_);
    cublasLtMatmulDescDestroy(desc_);
    cublasLtDestroy(handle_);
  }
  RawGemm(const RawGemm&) = delete;
  RawGemm& operator=(const RawGemm&) = delete;

  void run(const void* a, const void* b, void* c, cudaStream_t stream) const {
    const float alpha = 1.f, beta = 0.f;
    CHECK_LT(cublasLtMatmul(handle_, desc_, &alpha, b, la_, a, lb_, &beta, c, lc_, c, lc_, &algo_,
                            workspace_, kRawWorkspace, stream));
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* workspace_ = nullptr;
};

// Median milliseconds per call of f over 20 samples of `reps` back-to-back calls, after 5
// warm-up calls and one timed call that sizes the samples (about 5 ms each).
template <typename F>
double median_ms(F&& f, cudaStream_t stream) {
  const double once = td::bench::median_ms(f, stream, 5, 1);
  const int reps = std::clamp(static_cast<int>(5.0 / std::max(once, 1e-3)), 1, 50);
  return td::bench::median_ms(f, stream, 0, 20, reps);
}

// Uniform values in [-1, 1) from a fixed LCG (fast for 64M elements), as a CUDA tensor of dt.
td::Tensor device_random(int64_t rows, int64_t cols, td::DType dt, uint64_t seed) {
  td::Tensor h = td::Tensor::empty({rows, cols}, td::DType::Float32, td::kCPU);
  float* p = h.data_ptr<float>();
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (int64_t i = 0; i < rows * cols; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    p[i] = static_cast<float>(static_cast<double>(x >> 40) / 8388608.0 - 1.0);
  }
  return h.to(dt).to(td::cuda_device(0));
}

// Dense tensor-core peak (TFLOP/s) for bf16/fp16; TF32 is half of it on these parts.
double dense_peak_tflops(const cudaDeviceProp& prop, std::string* assumption) {
  const std::string name = prop.name;
  if (prop.major == 9 && prop.minor == 0) {
    if (name.find("PCIe") != std::string::npos) {
      *assumption = "sm_90 H100 PCIe: 756 TFLOP/s dense bf16";
      return 756.0;
    }
    *assumption = "sm_90 H100/H200 SXM: 989 TFLOP/s dense bf16";
    return 989.0;
  }
  if (prop.major == 8 && prop.minor == 0) {
    *assumption = "sm_80 A100: 312 TFLOP/s dense bf16";
    return 312.0;
  }
  *assumption = "unknown device: no peak assumed";
  return 0.0;
}

// Max |td - raw| over the first elements of the two results (same algorithm family: ~0).
double max_abs_diff(const td::Tensor& td_out, const td::Tensor& raw_out) {
  const int64_t n = std::min<int64_t>(td_out.numel(), 4096);
  const td::Tensor a = td_out.reshape({-1}).narrow(0, 0, n).to(td::kCPU).to(td::DType::Float32);
  const td::Tensor b = raw_out.reshape({-1}).narrow(0, 0, n).to(td::kCPU).to(td::DType::Float32);
  const float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>();
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(static_cast<double>(pa[i]) - pb[i]));
  return d;
}

struct Case {
  const char* name;
  td::DType dtype;
  cudaDataType_t cuda_type;
  cublasComputeType_t compute;
  bool tf32;
  int64_t size;
};

// FP8 (issue 27): C[M,N] = A[M,K] B[N,K]^T with e4m3 codes and a bf16 output through
// td::fp8_scaled_mm (fp32 accumulation, as training uses it), and through the kernel with
// cuBLASLt's fast accumulation (TransformerEngine's forward setting), against td's bf16 GEMM of
// the same product. Target: >= 1.6x bf16 at 8192^3. FP8's dense peak is twice bf16's.
void fp8_cases(const cudaDeviceProp& prop, double peak16, cudaStream_t stream) {
  if (!td::kernels::gemm_fp8_supported_device()) {
    std::printf("{\"bench\":\"gemm_fp8\",\"skipped\":\"%s has no FP8 tensor cores\"}\n", prop.name);
    return;
  }
  for (int64_t size : {4096, 8192}) {
    const int64_t m = size, n = size, k = size;
    const td::Tensor a16 = device_random(m, k, td::DType::BFloat16, 3);
    const td::Tensor b16 = device_random(n, k, td::DType::BFloat16, 4);
    // Values in [-1, 1) scaled by 400 fill e4m3's range (max 448).
    const td::Tensor a8 = td::fp8_quantize(a16, td::Fp8Format::E4M3FN, 400.0);
    const td::Tensor b8 = td::fp8_quantize(b16, td::Fp8Format::E4M3FN, 400.0);
    const td::Tensor bt = td::transpose(b16, 0, 1);
    td::Tensor out16, out8;
    const double bf16_ms = median_ms([&] { out16 = td::mm(a16, bt); }, stream);
    const double fp8_ms = median_ms(
        [&] { out8 = td::fp8_scaled_mm(a8, 400.0, b8, 400.0, td::DType::BFloat16); }, stream);
    td::Tensor fast = td::Tensor::empty({m, n}, td::DType::BFloat16, td::cuda_device(0));
    const size_t ws_bytes = td::kernels::gemm_workspace_bytes();
    td::Tensor ws = td::Tensor::empty({static_cast<int64_t>(ws_bytes)}, td::DType::Float8E4M3FN,
                                      td::cuda_device(0));
    td::kernels::Fp8GemmArgs g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a8.data_ptr();
    g.lda = k;
    g.b = b8.data_ptr();
    g.ldb = k;
    g.c = fast.data_ptr();
    g.ldc = n;
    g.alpha = static_cast<float>(1.0 / (400.0 * 400.0));
    g.fast_accum = true;
    g.workspace = ws.data_ptr();
    g.workspace_bytes = ws_bytes;
    g.stream = stream;
    const double fast_ms = median_ms([&] { td::kernels::gemm_fp8(g); }, stream);
    TD_BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
    const double flop = 2.0 * static_cast<double>(m) * n * k;
    const double t16 = flop / bf16_ms * 1e-9, t8 = flop / fp8_ms * 1e-9, tf = flop / fast_ms * 1e-9;
    std::printf(
        "{\"bench\":\"gemm_fp8\",\"m\":%ld,\"n\":%ld,\"k\":%ld,\"fp8_ms\":%.4f,"
        "\"fp8_tflops\":%.1f,\"fp8_fast_accum_tflops\":%.1f,\"bf16_tflops\":%.1f,"
        "\"speedup_vs_bf16\":%.3f,\"speedup_fast_accum_vs_bf16\":%.3f,\"target_speedup\":1.6,"
        "\"fp8_fraction_of_peak\":%.3f,\"max_abs_diff_fp8_vs_bf16\":%.3g,\"device\":\"%s\"}\n",
        static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), fp8_ms, t8, tf, t16,
        t8 / t16, tf / t16, peak16 > 0 ? t8 / (2 * peak16) : 0.0, max_abs_diff(out8, out16),
        prop.name);
    std::fflush(stdout);
  }
}

}  // namespace

int main() {
  if (td::bench::skip_without_cuda("gemm")) return 0;
  try {
    cudaDeviceProp prop{};
    TD_BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    TD_BENCH_CHECK_CUDA(cudaSetDevice(0));
    std::string assumption;
    const double peak16 = dense_peak_tflops(prop, &assumption);
    // td launches on the device's current stream; the raw calls and the events use it too.
    const cudaStream_t stream = td::cuda::current_stream(0).handle();
    const Case cases[] = {
        {"bf16", td::DType::BFloat16, CUDA_R_16BF, CUBLAS_COMPUTE_32F, false, 4096},
        {"bf16", td::DType::BFloat16, CUDA_R_16BF, CUBLAS_COMPUTE_32F, false, 8192},
        {"fp16", td::DType::Float16, CUDA_R_16F, CUBLAS_COMPUTE_32F, false, 4096},
        {"fp16", td::DType::Float16, CUDA_R_16F, CUBLAS_COMPUTE_32F, false, 8192},
        {"fp32_tf32", td::DType::Float32, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, true, 4096},
    };
    for (const Case& c : cases) {
      const int64_t m = c.size, n = c.size, k = c.size;
      td::set_matmul_allow_tf32(c.tf32);
      const td::Tensor a = device_random(m, k, c.dtype, 1), b = device_random(k, n, c.dtype, 2);
      td::Tensor raw_out = td::Tensor::empty({m, n}, c.dtype, td::cuda_device(0));
      RawGemm raw(c.cuda_type, c.compute, m, n, k);
      td::Tensor td_out;
      const double td_ms = median_ms([&] { td_out = td::mm(a, b); }, stream);
      const double raw_ms = median_ms(
          [&] { raw.run(a.data_ptr(), b.data_ptr(), raw_out.data_ptr(), stream); }, stream);
      TD_BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
      const double flop = 2.0 * static_cast<double>(m) * n * k;
      const double td_tflops = flop / td_ms * 1e-9, raw_tflops = flop / raw_ms * 1e-9;
      const double peak = c.tf32 ? peak16 / 2 : peak16;
      std::printf(
          "{\"bench\":\"gemm\",\"dtype\":\"%s\",\"m\":%ld,\"n\":%ld,\"k\":%ld,\"td_ms\":%.4f,"
          "\"cublaslt_ms\":%.4f,\"td_tflops\":%.1f,\"cublaslt_tflops\":%.1f,\"ratio\":%.3f,"
          "\"peak_tflops\":%.1f,\"td_fraction_of_peak\":%.3f,\"max_abs_diff_td_vs_raw\":%.3g,"
          "\"device\":\"%s\",\"peak_assumption\":\"%s\"}\n",
          c.name, static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), td_ms, raw_ms,
          td_tflops, raw_tflops, td_tflops / raw_tflops, peak, peak > 0 ? td_tflops / peak : 0.0,
          max_abs_diff(td_out, raw_out), prop.name, assumption.c_str());
      std::fflush(stdout);
    }
    td::set_matmul_allow_tf32(false);
    fp8_cases(prop, peak16, stream);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
}
