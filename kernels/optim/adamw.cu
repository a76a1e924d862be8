#include "common/cuda_types.cuh"
#include "optim/adamw.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kNormThreads = 256;

template <typename Chunk>
void upload(const Chunk* host, int64_t num, Chunk* device, cudaStream_t stream) {
  // From pageable memory the copy is staged before cudaMemcpyAsync returns, so `host` may be
  // freed as soon as this returns.
  TD_CUDA_CHECK(cudaMemcpyAsync(device, host, static_cast<size_t>(num) * sizeof(Chunk),
                                cudaMemcpyHostToDevice, stream));
}

template <typename T>
__device__ __forceinline__ bool aligned4(const void* p) {
  return is_aligned<static_cast<int>(sizeof(T)) * 4>(p);
}

// ---- AdamW ----

__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v,
                                             const AdamWCoeffs& c) {
  const float pi = p * c.decay;
  const float mi = m + c.one_minus_b1 * (g - m);
  const float vi = c.b2 * v + c.one_minus_b2 * g * g;
  m = mi;
  v = vi;
  p = pi - c.step_size * mi / (sqrtf(vi) / c.bc2_sqrt + c.eps);
}

// coeffs_dev: null, or the coefficients in device memory (Note [Capturable AdamW]), read
// instead of `c_host`.
template <typename TP, typename TG>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const AdamWChunk* __restrict__ chunks, AdamWCoeffs c_host,
                 const AdamWCoeffs* __restrict__ coeffs_dev) {
  const AdamWCoeffs c = coeffs_dev != nullptr ? *coeffs_dev : c_host;
  const AdamWChunk ch = chunks[blockIdx.x];
  TP* __restrict__ p = static_cast<TP*>(ch.p);
  const TG* __restrict__ g = static_cast<const TG*>(ch.g);
  float* __restrict__ m = ch.m;
  float* __restrict__ v = ch.v;
  const bool vec = aligned4<TP>(p) && aligned4<TG>(g) && aligned4<float>(m) && aligned4<float>(v);
  const int64_t nvec = vec ? ch.n / 4 : 0;
  for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
    Vec<TP, 4> pv = reinterpret_cast<const Vec<TP, 4>*>(p)[k];
    const Vec<TG, 4> gv = reinterpret_cast<const Vec<TG, 4>*>(g)[k];
    Vec<float, 4> mv = reinterpret_cast<const Vec<float, 4>*>(m)[k];
    Vec<float, 4> vv = reinterpret_cast<const Vec<float, 4>*>(v)[k];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      float pf = to_float(pv.v[l]);
      adamw_update(pf, to_float(gv.v[l]), mv.v[l], vv.v[l], c);
      pv.v[l] = from_float<TP>(pf);
    }
    reinterpret_cast<Vec<TP, 4>*>(p)[k] = pv;
    reinterpret_cast<Vec<float, 4>*>(m)[k] = mv;
    reinterpret_cast<Vec<float, 4>*>(v)[k] = vv;
  }
  for (int64_t i = nvec * 4 + threadIdx.x; i < ch.n; i += blockDim.x) {
    float pf = to_float(p[i]), mf = m[i], vf = v[i];
    adamw_update(pf, to_float(g[i]), mf, vf, c);
    p[i] = from_float<TP>(pf);
    m[i] = mf;
    v[i] = vf;
  }
}

// ---- SGD ----

__device__ __forceinline__ void sgd_update(float& p, float g, float* buf, bool first,
                                           const SGDCoeffs& c) {
  float d = g;
  if (c.weight_decay != 0.0f) d = d + c.weight_decay * p;
  if (buf != nullptr) {
    const float b = first ? d : c.momentum * *buf + c.one_minus_dampening * d;
    *buf = b;
    d = c.nesterov ? d + c.momentum * b : b;
  }
  p = p - c.lr * d;
}

template <typename TP, typename TG>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(const SGDChunk* __restrict__ chunks, SGDCoeffs c) {
  const SGDChunk ch = chunks[blockIdx.x];
  TP* __restrict__ p = static_cast<TP*>(ch.p);
  const TG* __restrict__ g = static_cast<const TG*>(ch.g);
  float* __restrict__ buf = ch.buf;
  const bool first = ch.first != 0;
  const bool vec = aligned4<TP>(p) && aligned4<TG>(g) && (buf == nullptr || aligned4<float>(buf));
  const int64_t nvec = vec ? ch.n / 4 : 0;
  for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
    Vec<TP, 4> pv = reinterpret_cast<const Vec<TP, 4>*>(p)[k];
    const Vec<TG, 4> gv = reinterpret_cast<const Vec<TG, 4>*>(g)[k];
    Vec<float, 4> bv{};
    if (buf != nullptr) bv = reinterpret_cast<const Vec<float, 4>*>(buf)[k];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      float pf = to_float(pv.v[l]);
      sgd_update(pf, to_float(gv.v[l]), buf != nullptr ? &bv.v[l] : nullptr, first, c);
      pv.v[l] = from_float<TP>(pf);
    }
    reinterpret_cast<Vec<TP, 4>*>(p)[k] = pv;
    if (buf != nullptr) reinterpret_cast<Vec<float, 4>*>(buf)[k] = bv;
  }
  for (int64_t i = nvec * 4 + threadIdx.x; i < ch.n; i += blockDim.x) {
    float pf = to_float(p[i]);
    sgd_update(pf, to_float(g[i]), buf != nullptr ? buf + i : nullptr, first, c);
    p[i] = from_float<TP>(pf);
  }
}

// ---- Gradient norm partials ----

__device__ __forceinline__ double nan_max(double a, double b) {
  return (isnan(a) || isnan(b)) ? NAN : fmax(a, b);
}

__device__ __forceinline__ double norm_combine(int kind, double acc, double x) {
  return kind == 0 ? nan_max(acc, x) : acc + x;
}

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    grad_norm_kernel(const NormChunk* __restrict__ chunks, int kind, double p,
                     double* __restrict__ partials) {
  __shared__ double shared[kNormThreads];
  const NormChunk ch = chunks[blockIdx.x];
  const T* __restrict__ x = static_cast<const T*>(ch.x);
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) {
    const double a = fabs(static_cast<double>(to_float(x[i])));
    const double term = kind == 2 ? a * a : kind == 3 ? pow(a, p) : a;
    acc = norm_combine(kind, acc, term);
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  // Fixed tree over the block (blockDim.x == kNormThreads, a power of two).
  for (int s = kNormThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) {
      shared[threadIdx.x] = norm_combine(kind, shared[threadIdx.x], shared[threadIdx.x + s]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[ch.slot] = shared[0];
}

}  // namespace

template <typename TP, typename TG>
void adamw_multi_tensor(const AdamWChunk* host_chunks, int64_t num_chunks,
                        AdamWChunk* device_chunks, const AdamWCoeffs& c, cudaStream_t stream) {
  if (num_chunks == 0) return;
  upload(host_chunks, num_chunks, device_chunks, stream);
  adamw_kernel<TP, TG>
      <<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(device_chunks, c, nullptr);
  TD_CUDA_LAUNCH_CHECK();
}

template <typename TP, typename TG>
void adamw_multi_tensor_device(const AdamWChunk* device_chunks, int64_t num_chunks,
                               const AdamWCoeffs* device_coeffs, cudaStream_t stream) {
  if (num_chunks == 0) return;
  adamw_kernel<TP, TG><<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(
      device_chunks, AdamWCoeffs{}, device_coeffs);
  TD_CUDA_LAUNCH_CHECK();
}

template <typename TP, typename TG>
void sgd_multi_tensor(const SGDChunk* host_chunks, int64_t num_chunks, SGDChunk* device_chunks,
                      const SGDCoeffs& c, cudaStream_t stream) {
  if (num_chunks == 0) return;
  upload(host_chunks, num_chunks, device_chunks, stream);
  sgd_kernel<TP, TG><<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(device_chunks, c);
  TD_CUDA_LAUNCH_CHECK();
}

template <typename T>
void grad_norm_partials(const NormChunk* host_chunks, int64_t num_chunks, NormChunk* device_chunks,
                        int kind, double p, double* partials, cudaStream_t stream) {
  if (num_chunks == 0) return;
  upload(host_chunks, num_chunks, device_chunks, stream);
  grad_norm_kernel<T><<<static_cast<unsigned>(num_chunks), kNormThreads, 0, stream>>>(
      device_chunks, kind, p, partials);
  TD_CUDA_LAUNCH_CHECK();
}

#define TD_OPTIM_INSTANTIATE(T)                                                                    \
  template void adamw_multi_tensor<T, T>(const AdamWChunk*, int64_t, AdamWChunk*,                  \
                                         const AdamWCoeffs&, cudaStream_t);                        \
  template void adamw_multi_tensor_device<T, T>(const AdamWChunk*, int64_t, const AdamWCoeffs*,    \
                                                cudaStream_t);                                     \
  template void sgd_multi_tensor<T, T>(const SGDChunk*, int64_t, SGDChunk*, const SGDCoeffs&,      \
                                       cudaStream_t);                                              \
  template void grad_norm_partials<T>(const NormChunk*, int64_t, NormChunk*, int, double, double*, \
                                      cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_OPTIM_INSTANTIATE)

#define TD_OPTIM_INSTANTIATE_F32_GRAD(T)                                                          \
  template void adamw_multi_tensor<T, float>(const AdamWChunk*, int64_t, AdamWChunk*,             \
                                             const AdamWCoeffs&, cudaStream_t);                   \
  template void adamw_multi_tensor_device<T, float>(const AdamWChunk*, int64_t,                   \
                                                    const AdamWCoeffs*, cudaStream_t);            \
  template void sgd_multi_tensor<T, float>(const SGDChunk*, int64_t, SGDChunk*, const SGDCoeffs&, \
                                           cudaStream_t);
TD_OPTIM_INSTANTIATE_F32_GRAD(__nv_bfloat16)
TD_OPTIM_INSTANTIATE_F32_GRAD(__half)

}  // namespace td::kernels
