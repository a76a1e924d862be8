// GEMM through cuBLASLt (gemm.cuh). See Note [Row-major GEMM on cuBLASLt].
#include <cublasLt.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/cuda_types.cuh"
#include "gemm/gemm.cuh"
#include "runtime/cuda_check.cuh"
#include "tardelli/core/error.h"

namespace td::kernels {
namespace {

const char* type_name(GemmType t) {
  switch (t) {
    case GemmType::kFloat32:
      return "float32";
    case GemmType::kBFloat16:
      return "bfloat16";
    case GemmType::kFloat16:
      return "float16";
  }
  return "?";
}

cudaDataType_t cuda_data_type(GemmType t) {
  switch (t) {
    case GemmType::kFloat32:
      return CUDA_R_32F;
    case GemmType::kBFloat16:
      return CUDA_R_16BF;
    case GemmType::kFloat16:
      return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

size_t element_bytes(GemmType t) {
  return t == GemmType::kFloat32 ? 4 : 2;
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "none";
    case CUBLASLT_EPILOGUE_BIAS:
      return "bias";
    case CUBLASLT_EPILOGUE_GELU:
      return "gelu";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return "bias+gelu";
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return "gelu with aux";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "bias+gelu with aux";
    case CUBLASLT_EPILOGUE_BGRADA:
      return "bias gradient of B (BGRADA)";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "bias gradient of A (BGRADB)";
    default:
      return "?";
  }
}

// Note [cuBLASLt handles]: one handle per device, created on first use (with that device
// current) and kept for the life of the process: destroying them from a static destructor
// would race the driver's own teardown. cuBLASLt may be called from many host threads on one
// handle; the workspace and stream are passed with every call, so nothing in it is shared.
cublasLtHandle_t handle_for(int device) {
  static std::mutex mu;
  static std::vector<cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(device) >= handles.size()) handles.resize(device + 1, nullptr);
  if (handles[device] == nullptr) TD_CUBLAS_CHECK(cublasLtCreate(&handles[device]));
  return handles[device];
}

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using MatrixLayout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

template <typename V>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  TD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <typename V>
void set_attr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& v) {
  TD_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v)));
}
template <typename V>
void set_attr(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
  TD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

// A column-major rows x cols layout with leading dimension ld and a strided batch.
MatrixLayout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                         int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  TD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                             static_cast<uint64_t>(cols), ld));
  MatrixLayout owned(l);
  if (batch > 1) {
    set_attr(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batch));
    set_attr(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return owned;
}

// The largest power of two (at most 256) dividing the address: what cuBLASLt may assume.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// Note [GEMM heuristic cache]: cublasLtMatmulAlgoGetHeuristic costs tens of microseconds, more
// than a small GEMM, so its first answer is kept per problem: everything the heuristic sees
// (device, types, shapes, leading dims, batch, epilogue, pointer alignments, workspace).
// Descriptors are rebuilt per call (cheap host objects) because they hold the pointers of the
// call. The map is cleared if it ever grows past kMaxCachedAlgos (shapes that never repeat).
using AlgoKey = std::array<int64_t, 24>;
constexpr size_t kMaxCachedAlgos = 4096;

std::mutex g_algo_mu;
std::map<AlgoKey, cublasLtMatmulAlgo_t>& algo_cache() {
  static std::map<AlgoKey, cublasLtMatmulAlgo_t> cache;
  return cache;
}

// The cached algorithm for `key`, or query()'s answer, then cached.
template <typename Query>
cublasLtMatmulAlgo_t cached_algo(const AlgoKey& key, Query&& query) {
  {
    std::lock_guard<std::mutex> lock(g_algo_mu);
    auto it = algo_cache().find(key);
    if (it != algo_cache().end()) return it->second;
  }
  const cublasLtMatmulAlgo_t algo = query();
  std::lock_guard<std::mutex> lock(g_algo_mu);
  if (algo_cache().size() >= kMaxCachedAlgos) algo_cache().clear();
  algo_cache().emplace(key, algo);
  return algo;
}

// The preference every query uses: at most `workspace` bytes of scratch, and the alignments of
// the call's pointers (cuBLASLt's A, B, C and D).
Preference make_preference(size_t workspace, const void* a, const void* b, const void* c) {
  cublasLtMatmulPreference_t pref_raw = nullptr;
  TD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
  Preference pref(pref_raw);
  set_attr(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace));
  set_attr(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(a));
  set_attr(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(b));
  set_attr(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(c));
  set_attr(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(c));
  return pref;
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// k == 0: op(A) op(B) is all zeros, so C = act(beta * C + bias). Grid-stride over batch*m*n.
template <typename T>
__global__ void empty_k_kernel(T* c, int64_t m, int64_t n, int64_t ldc, int64_t stride_c,
                               int64_t total, float beta, const T* bias, bool gelu, T* aux,
                               int64_t ld_aux, int64_t stride_aux) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t col = i % n;
    const int64_t row = (i / n) % m;
    const int64_t bi = i / (m * n);
    T* p = c + bi * stride_c + row * ldc + col;
    float v = beta != 0.f ? beta * to_float(*p) : 0.f;
    if (bias != nullptr) v += to_float(bias[col]);
    if (aux != nullptr) aux[bi * stride_aux + row * ld_aux + col] = from_float<T>(v);
    if (gelu) v = gelu_tanh(v);
    *p = from_float<T>(v);
  }
}

template <typename T>
void launch_empty_k(const GemmArgs& g) {
  const int64_t total = g.batch * g.m * g.n;
  constexpr int kThreads = 256;
  empty_k_kernel<T><<<grid_for(total, kThreads), kThreads, 0, g.stream>>>(
      static_cast<T*>(g.c), g.m, g.n, g.ldc, g.stride_c, total, g.beta,
      static_cast<const T*>(g.bias), g.gelu, static_cast<T*>(g.gelu_aux), g.ld_aux, g.stride_aux);
  TD_CUDA_LAUNCH_CHECK();
}

void gemm_empty_k(const GemmArgs& g) {
  if (g.bias_grad_of != GemmBiasGrad::kNone) {
    const int64_t len = g.bias_grad_of == GemmBiasGrad::kA ? g.m : g.n;
    // A sum over no terms; all-zero bits are 0.0 in every GemmType.
    TD_CUDA_CHECK(cudaMemsetAsync(g.bias_grad, 0, len * element_bytes(g.dtype), g.stream));
  }
  switch (g.dtype) {
    case GemmType::kFloat32:
      return launch_empty_k<float>(g);
    case GemmType::kBFloat16:
      return launch_empty_k<__nv_bfloat16>(g);
    case GemmType::kFloat16:
      return launch_empty_k<__half>(g);
  }
}

cublasLtEpilogue_t epilogue_of(const GemmArgs& g) {
  if (g.bias_grad_of == GemmBiasGrad::kA) return CUBLASLT_EPILOGUE_BGRADB;
  if (g.bias_grad_of == GemmBiasGrad::kB) return CUBLASLT_EPILOGUE_BGRADA;
  if (g.gelu) {
    if (g.gelu_aux != nullptr) {
      return g.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    }
    return g.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  }
  return g.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

void check_args(const GemmArgs& g) {
  TD_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, "gemm: bad sizes m=", g.m, " n=", g.n,
           " k=", g.k, " batch=", g.batch);
  TD_CHECK(g.batch <= INT32_MAX, "gemm: batch ", g.batch, " exceeds cuBLASLt's int32 count");
  TD_CHECK(g.lda >= std::max<int64_t>(1, g.trans_a ? g.m : g.k), "gemm: lda=", g.lda,
           " too small for ", g.trans_a ? "A^T" : "A", " with m=", g.m, " k=", g.k);
  TD_CHECK(g.ldb >= std::max<int64_t>(1, g.trans_b ? g.k : g.n), "gemm: ldb=", g.ldb,
           " too small for ", g.trans_b ? "B^T" : "B", " with k=", g.k, " n=", g.n);
  TD_CHECK(g.ldc >= std::max<int64_t>(1, g.n), "gemm: ldc=", g.ldc, " smaller than n=", g.n);
  TD_CHECK(g.batch == 1 || (g.stride_a != 0 && g.stride_b != 0 && g.stride_c != 0),
           "gemm: batch strides must be non-zero (got ", g.stride_a, ", ", g.stride_b, ", ",
           g.stride_c, ")");
  TD_CHECK(g.gelu_aux == nullptr || g.gelu, "gemm: gelu_aux given without gelu");
  if (g.gelu_aux != nullptr) {
    TD_CHECK(g.ld_aux >= g.n && g.ld_aux % 8 == 0, "gemm: GELU aux row stride ", g.ld_aux,
             " must be >= n=", g.n, " and a multiple of 8 (cuBLASLt)");
    TD_CHECK(g.batch == 1 || g.stride_aux % 8 == 0, "gemm: GELU aux batch stride ", g.stride_aux,
             " must be a multiple of 8 (cuBLASLt)");
  }
  if (g.bias_grad_of != GemmBiasGrad::kNone) {
    TD_CHECK(g.bias_grad != nullptr, "gemm: bias gradient requested without an output pointer");
    TD_CHECK(g.bias == nullptr && !g.gelu && g.batch == 1,
             "gemm: the bias gradient epilogue takes no bias, no GELU and batch 1");
  }
  TD_CHECK(g.workspace != nullptr || g.workspace_bytes == 0,
           "gemm: workspace_bytes without a workspace pointer");
}

}  // namespace

size_t gemm_workspace_bytes() {
  int device = 0, major = 0;
  TD_CUDA_CHECK(cudaGetDevice(&device));
  TD_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9 ? (size_t{32} << 20) : (size_t{8} << 20);
}

void gemm(const GemmArgs& g) {
  check_args(g);
  if (g.m == 0 || g.n == 0) return;  // nothing to write (bias gradient of length 0 included)
  if (g.k == 0) return gemm_empty_k(g);

  int device = 0;
  TD_CUDA_CHECK(cudaGetDevice(&device));
  cublasLtHandle_t handle = handle_for(device);

  const cudaDataType_t type = cuda_data_type(g.dtype);
  const bool tf32 = g.dtype == GemmType::kFloat32 && g.allow_tf32;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasLtEpilogue_t epilogue = epilogue_of(g);
  // cuBLASLt's A is our B, its B our A (Note [Row-major GEMM on cuBLASLt]).
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;

  cublasLtMatmulDesc_t desc_raw = nullptr;
  TD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_raw, compute, CUDA_R_32F));
  MatmulDesc desc(desc_raw);
  set_attr(desc_raw, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_attr(desc_raw, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set_attr(desc_raw, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  const void* bias_ptr = g.bias_grad_of != GemmBiasGrad::kNone ? g.bias_grad : g.bias;
  if (bias_ptr != nullptr) set_attr(desc_raw, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
  if (g.gelu_aux != nullptr) {
    set_attr(desc_raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.gelu_aux);
    set_attr(desc_raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ld_aux);
    if (g.batch > 1) {
      set_attr(desc_raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, g.stride_aux);
    }
  }

  // Stored (column-major) shapes: our B is n x k (op N) or k x n (op T), our A is k x m or m x k.
  MatrixLayout la =
      make_layout(type, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb, g.batch, g.stride_b);
  MatrixLayout lb =
      make_layout(type, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda, g.batch, g.stride_a);
  MatrixLayout lc = make_layout(type, g.n, g.m, g.ldc, g.batch, g.stride_c);

  const AlgoKey key{device,
                    static_cast<int64_t>(g.dtype),
                    tf32,
                    g.trans_a,
                    g.trans_b,
                    g.m,
                    g.n,
                    g.k,
                    g.lda,
                    g.ldb,
                    g.ldc,
                    g.batch,
                    g.stride_a,
                    g.stride_b,
                    g.stride_c,
                    static_cast<int64_t>(epilogue),
                    g.ld_aux,
                    g.stride_aux,
                    alignment_of(g.a),
                    alignment_of(g.b),
                    alignment_of(g.c),
                    bias_ptr != nullptr ? alignment_of(bias_ptr) : 0,
                    g.gelu_aux != nullptr ? alignment_of(g.gelu_aux) : 0,
                    static_cast<int64_t>(g.workspace_bytes)};

  const cublasLtMatmulAlgo_t algo = cached_algo(key, [&] {
    // Our A is cuBLASLt's B and vice versa.
    Preference pref = make_preference(g.workspace_bytes, g.b, g.a, g.c);
    if (g.dtype != GemmType::kFloat32) {
      // fp32 accumulation throughout: no split-k partial sums rounded to bf16/fp16.
      set_attr(pref.get(), CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
               static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle, desc_raw, la.get(), lb.get(), lc.get(), lc.get(),
                                       pref.get(), 1, &result, &returned);
    TD_CHECK(st == CUBLAS_STATUS_SUCCESS && returned > 0,
             "gemm: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k,
             " batch=", g.batch, " dtype=", type_name(g.dtype), tf32 ? " (tf32)" : "",
             " trans_a=", g.trans_a, " trans_b=", g.trans_b, " lda=", g.lda, " ldb=", g.ldb,
             " ldc=", g.ldc, " epilogue=", epilogue_name(epilogue),
             " (heuristic status: ", cublasGetStatusName(st), ")");
    return result.algo;
  });

  const float alpha = g.alpha, beta = g.beta;
  TD_CUBLAS_CHECK(cublasLtMatmul(handle, desc_raw, &alpha, g.b, la.get(), g.a, lb.get(), &beta, g.c,
                                 lc.get(), g.c, lc.get(), &algo, g.workspace, g.workspace_bytes,
                                 g.stream));
}

namespace {

cudaDataType_t fp8_data_type(Fp8Type t) {
  return t == Fp8Type::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

const char* fp8_type_name(Fp8Type t) {
  return t == Fp8Type::kE4M3 ? "e4m3" : "e5m2";
}

void check_fp8_args(const Fp8GemmArgs& g) {
  TD_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "gemm_fp8: bad sizes m=", g.m, " n=", g.n, " k=", g.k);
  TD_CHECK(g.a_type == Fp8Type::kE4M3 || g.b_type == Fp8Type::kE4M3,
           "gemm_fp8: cuBLASLt has no e5m2 x e5m2 kernel (one operand must be e4m3)");
  TD_CHECK(g.lda >= std::max<int64_t>(g.k, 1) && g.lda % 16 == 0 &&
               g.ldb >= std::max<int64_t>(g.k, 1) && g.ldb % 16 == 0,
           "gemm_fp8: the row strides of A (", g.lda, ") and B (", g.ldb,
           ") must be multiples of 16 and >= k=", g.k, " (Note [FP8 GEMM on cuBLASLt])");
  TD_CHECK(g.ldc >= std::max<int64_t>(g.n, 1) &&
               (g.ldc * static_cast<int64_t>(element_bytes(g.c_type))) % 16 == 0,
           "gemm_fp8: the output row stride ", g.ldc, " must be >= n=", g.n,
           " and a multiple of 16 bytes");
  TD_CHECK(g.bias == nullptr || g.c_type != GemmType::kFloat32,
           "gemm_fp8: a bias epilogue needs a bfloat16 or float16 output");
  TD_CHECK(g.workspace != nullptr || g.workspace_bytes == 0,
           "gemm_fp8: workspace_bytes without a workspace pointer");
}

}  // namespace

bool gemm_fp8_supported_device() {
  int device = 0, major = 0, minor = 0;
  TD_CUDA_CHECK(cudaGetDevice(&device));
  TD_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TD_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major > 8 || (major == 8 && minor >= 9);
}

// Note [FP8 GEMM on cuBLASLt].
void gemm_fp8(const Fp8GemmArgs& g) {
  check_fp8_args(g);
  if (g.m == 0 || g.n == 0) return;
  TD_CHECK(gemm_fp8_supported_device(),
           "gemm_fp8: this device has no FP8 tensor cores (compute capability 8.9 or newer)");
  if (g.k == 0) {  // nothing to multiply: C = bias, as gemm() does
    GemmArgs e;
    e.dtype = g.c_type;
    e.m = g.m;
    e.n = g.n;
    e.ldc = g.ldc;
    e.c = g.c;
    e.bias = g.bias;
    e.stream = g.stream;
    return gemm_empty_k(e);
  }

  int device = 0;
  TD_CUDA_CHECK(cudaGetDevice(&device));
  cublasLtHandle_t handle = handle_for(device);
  const cudaDataType_t c_type = cuda_data_type(g.c_type);

  cublasLtMatmulDesc_t desc_raw = nullptr;
  TD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_raw, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MatmulDesc desc(desc_raw);
  set_attr(desc_raw, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_attr(desc_raw, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attr(desc_raw, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(g.fast_accum ? 1 : 0));
  const cublasLtEpilogue_t epilogue =
      g.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  set_attr(desc_raw, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (g.bias != nullptr) {
    set_attr(desc_raw, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    set_attr(desc_raw, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(c_type));
  }

  // cuBLASLt's A is our B (column-major k x n, transposed), its B our A (k x m), its D n x m.
  MatrixLayout la = make_layout(fp8_data_type(g.b_type), g.k, g.n, g.ldb, 1, 0);
  MatrixLayout lb = make_layout(fp8_data_type(g.a_type), g.k, g.m, g.lda, 1, 0);
  MatrixLayout lc = make_layout(c_type, g.n, g.m, g.ldc, 1, 0);

  // Tag 1000 keeps these keys apart from gemm()'s (whose second entry is a GemmType).
  const AlgoKey key{device,
                    1000,
                    static_cast<int64_t>(g.a_type),
                    static_cast<int64_t>(g.b_type),
                    static_cast<int64_t>(g.c_type),
                    g.fast_accum,
                    g.m,
                    g.n,
                    g.k,
                    g.lda,
                    g.ldb,
                    g.ldc,
                    static_cast<int64_t>(epilogue),
                    alignment_of(g.a),
                    alignment_of(g.b),
                    alignment_of(g.c),
                    g.bias != nullptr ? alignment_of(g.bias) : 0,
                    static_cast<int64_t>(g.workspace_bytes)};
  const cublasLtMatmulAlgo_t algo = cached_algo(key, [&] {
    Preference pref = make_preference(g.workspace_bytes, g.b, g.a, g.c);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle, desc_raw, la.get(), lb.get(), lc.get(), lc.get(),
                                       pref.get(), 1, &result, &returned);
    TD_CHECK(st == CUBLAS_STATUS_SUCCESS && returned > 0,
             "gemm_fp8: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k, " A ",
             fp8_type_name(g.a_type), " B ", fp8_type_name(g.b_type), " C ", type_name(g.c_type),
             " lda=", g.lda, " ldb=", g.ldb, " ldc=", g.ldc, " epilogue=", epilogue_name(epilogue),
             " (heuristic status: ", cublasGetStatusName(st), ")");
    return result.algo;
  });

  const float alpha = g.alpha, beta = 0.f;
  TD_CUBLAS_CHECK(cublasLtMatmul(handle, desc_raw, &alpha, g.b, la.get(), g.a, lb.get(), &beta, g.c,
                                 lc.get(), g.c, lc.get(), &algo, g.workspace, g.workspace_bytes,
                                 g.stream));
}

}  // namespace td::kernels
