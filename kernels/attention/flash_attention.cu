// Attention launchers: path choice (Note [Two attention paths]), the delta = rowsum(dO * O)
// kernel shared by both backward paths, and the reference kernels.
//
// Reference kernels: one warp per row; lane l holds head-dim elements l, l + 32, ... (up to
// kMaxRefHeadDim / 32 = 8 of them) in fp32 registers. Forward: one query row loops over its
// visible keys with an online softmax (running max m, sum l). Backward: a query-row kernel for
// dQ and a key-row kernel for dK/dV, each recomputing p = exp(scale q.k - lse); the key-row
// kernel loops over the query heads of its GQA group and the queries that see the key, so each
// dK/dV row is one warp's fixed-order sum.
#include "attention/flash_attention.cuh"
#include "common/cuda_types.cuh"
#include "runtime/cuda_check.cuh"

#include <type_traits>

namespace td::kernels {

namespace {

constexpr int kRefWarps = 4;  // rows per block
constexpr int kChunks = static_cast<int>(kMaxRefHeadDim / 32);

struct RefArgs {
  int64_t B, H, Hkv, group, Tq, Tk, D, Dv, shift;
  bool causal;
  float scale;
};

// Keys visible to query row i: [0, key_limit).
__device__ __forceinline__ int64_t key_limit(const RefArgs& a, int64_t i) {
  return a.causal ? min(a.Tk, i + a.shift + 1) : a.Tk;
}

template <typename T>
__device__ __forceinline__ void load_row(float (&x)[kChunks], const T* p, int64_t n, int lane) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    x[c] = d < n ? to_float(p[d]) : 0.f;
  }
}

// sum over the row of x * p[d] (all lanes get it).
template <typename T>
__device__ __forceinline__ float dot_row(const float (&x)[kChunks], const T* p, int64_t n,
                                         int lane) {
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < n) acc = fmaf(x[c], to_float(p[d]), acc);
  }
  return warp_sum(acc);
}

template <typename T>
__global__ void __launch_bounds__(kRefWarps * 32)
    ref_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       T* __restrict__ out, float* __restrict__ lse, const RefArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRefWarps + (threadIdx.x >> 5);
  if (row >= a.B * a.H * a.Tq) return;  // whole warps leave together
  const int64_t bh = row / a.Tq, i = row % a.Tq;
  const int64_t bkv = (bh / a.H) * a.Hkv + (bh % a.H) / a.group;
  const T* kh = k + bkv * a.Tk * a.D;
  const T* vh = v + bkv * a.Tk * a.Dv;
  float qr[kChunks], acc[kChunks];
  load_row(qr, q + row * a.D, a.D, lane);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t n = key_limit(a, i);
  for (int64_t j = 0; j < n; ++j) {
    const float s = dot_row(qr, kh + j * a.D, a.D, lane) * a.scale;
    const float m_new = fmaxf(m, s);
    const float alpha = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * alpha + p;
    const T* vr = vh + j * a.Dv;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < a.Dv) acc[c] = acc[c] * alpha + p * to_float(vr[d]);
    }
    m = m_new;
  }
  const float inv = 1.f / l;
  T* orow = out + row * a.Dv;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < a.Dv) orow[d] = from_float<T>(acc[c] * inv);
  }
  if (lane == 0) lse[row] = m + logf(l);
}

// delta[row] = sum_d dO[row, d] * O[row, d] in fp32, one warp per row.
template <typename T>
__global__ void __launch_bounds__(kRefWarps * 32)
    delta_kernel(const T* __restrict__ dout, const T* __restrict__ out, float* __restrict__ delta,
                 int64_t rows, int64_t Dv) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRefWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* g = dout + row * Dv;
  const T* o = out + row * Dv;
  float acc = 0.f;
  for (int64_t d = lane; d < Dv; d += 32) acc = fmaf(to_float(g[d]), to_float(o[d]), acc);
  acc = warp_sum(acc);
  if (lane == 0) delta[row] = acc;
}

// dQ of one query row per warp.
template <typename T>
__global__ void __launch_bounds__(kRefWarps * 32)
    ref_dq_kernel(const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                  const T* __restrict__ v, const float* __restrict__ lse,
                  const float* __restrict__ delta, T* __restrict__ dq, const RefArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRefWarps + (threadIdx.x >> 5);
  if (row >= a.B * a.H * a.Tq) return;
  const int64_t bh = row / a.Tq, i = row % a.Tq;
  const int64_t bkv = (bh / a.H) * a.Hkv + (bh % a.H) / a.group;
  const T* kh = k + bkv * a.Tk * a.D;
  const T* vh = v + bkv * a.Tk * a.Dv;
  float qr[kChunks], gr[kChunks], acc[kChunks];
  load_row(qr, q + row * a.D, a.D, lane);
  load_row(gr, dout + row * a.Dv, a.Dv, lane);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0.f;
  const float L = lse[row], Di = delta[row];
  const int64_t n = key_limit(a, i);
  for (int64_t j = 0; j < n; ++j) {
    const T* kr = kh + j * a.D;
    const float p = expf(dot_row(qr, kr, a.D, lane) * a.scale - L);
    const float dp = dot_row(gr, vh + j * a.Dv, a.Dv, lane);
    const float ds = p * (dp - Di) * a.scale;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < a.D) acc[c] = fmaf(ds, to_float(kr[d]), acc[c]);
    }
  }
  T* out = dq + row * a.D;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < a.D) out[d] = from_float<T>(acc[c]);
  }
}

// dK and dV of one key row per warp, summed over the query heads of its group.
template <typename T>
__global__ void __launch_bounds__(kRefWarps * 32)
    ref_dkdv_kernel(const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                    const T* __restrict__ v, const float* __restrict__ lse,
                    const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
                    const RefArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRefWarps + (threadIdx.x >> 5);
  if (row >= a.B * a.Hkv * a.Tk) return;
  const int64_t bkv = row / a.Tk, j = row % a.Tk;
  const int64_t b = bkv / a.Hkv, hkv = bkv % a.Hkv;
  float kr[kChunks], vr[kChunks], dka[kChunks], dva[kChunks];
  load_row(kr, k + row * a.D, a.D, lane);
  load_row(vr, v + row * a.Dv, a.Dv, lane);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) dka[c] = dva[c] = 0.f;
  // Query i sees key j iff j <= i + shift.
  const int64_t i0 = a.causal ? max(int64_t{0}, j - a.shift) : 0;
  for (int64_t h = hkv * a.group; h < (hkv + 1) * a.group; ++h) {
    const int64_t bh = b * a.H + h;
    for (int64_t i = i0; i < a.Tq; ++i) {
      const int64_t qrow = bh * a.Tq + i;
      const T* qr = q + qrow * a.D;
      const T* gr = dout + qrow * a.Dv;
      const float p = expf(dot_row(kr, qr, a.D, lane) * a.scale - lse[qrow]);
      const float dp = dot_row(vr, gr, a.Dv, lane);
      const float ds = p * (dp - delta[qrow]) * a.scale;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t d = lane + 32 * c;
        if (d < a.Dv) dva[c] = fmaf(p, to_float(gr[d]), dva[c]);
        if (d < a.D) dka[c] = fmaf(ds, to_float(qr[d]), dka[c]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < a.D) dk[row * a.D + d] = from_float<T>(dka[c]);
    if (d < a.Dv) dv[row * a.Dv + d] = from_float<T>(dva[c]);
  }
}

RefArgs ref_args(const AttentionShape& s) {
  return RefArgs{s.B, s.H,  s.Hkv,       s.H / s.Hkv, s.Tq,   s.Tk,
                 s.D, s.Dv, s.Tk - s.Tq, s.causal,    s.scale};
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(ceil_div(rows, kRefWarps));
}

}  // namespace

template <typename T>
bool attention_uses_tensor_cores(const AttentionShape& s, const void* q, const void* k,
                                 const void* v, const void* out) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    constexpr int64_t kIntMax = 0x7fffffff;
    return s.D == s.Dv && (s.D == 64 || s.D == 128) && is_aligned<16>(q) && is_aligned<16>(k) &&
           is_aligned<16>(v) && is_aligned<16>(out) && s.Tq + s.Tk < kIntMax / 2 &&
           s.B * s.H < kIntMax && ceil_div(s.Tq, 64) <= 65535 && ceil_div(s.Tk, 64) <= 65535;
  }
}

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, float* lse,
                       const AttentionShape& s, cudaStream_t stream, bool allow_tensor_cores) {
  if (s.B * s.H * s.Tq == 0 || s.Tk == 0) return;
  if constexpr (!std::is_same_v<T, float>) {
    if (allow_tensor_cores && attention_uses_tensor_cores<T>(s, q, k, v, out)) {
      attention_forward_tc<T>(q, k, v, out, lse, s, stream);
      return;
    }
  }
  const int64_t rows = s.B * s.H * s.Tq;
  ref_forward_kernel<T>
      <<<row_blocks(rows), kRefWarps * 32, 0, stream>>>(q, k, v, out, lse, ref_args(s));
  TD_CUDA_LAUNCH_CHECK();
}

template <typename T>
void attention_backward(const T* grad_out, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, T* dq, T* dk, T* dv, float* delta,
                        const AttentionShape& s, cudaStream_t stream, bool allow_tensor_cores) {
  if (s.B * s.H * s.Tq == 0 || s.Tk == 0) return;
  const int64_t rows = s.B * s.H * s.Tq;
  delta_kernel<T>
      <<<row_blocks(rows), kRefWarps * 32, 0, stream>>>(grad_out, out, delta, rows, s.Dv);
  TD_CUDA_LAUNCH_CHECK();
  if constexpr (!std::is_same_v<T, float>) {
    if (allow_tensor_cores && attention_uses_tensor_cores<T>(s, q, k, v, out) &&
        is_aligned<16>(grad_out) && is_aligned<16>(dq) && is_aligned<16>(dk) &&
        is_aligned<16>(dv)) {
      attention_backward_tc<T>(grad_out, q, k, v, lse, delta, dq, dk, dv, s, stream);
      return;
    }
  }
  const RefArgs a = ref_args(s);
  ref_dq_kernel<T>
      <<<row_blocks(rows), kRefWarps * 32, 0, stream>>>(grad_out, q, k, v, lse, delta, dq, a);
  TD_CUDA_LAUNCH_CHECK();
  const int64_t key_rows = s.B * s.Hkv * s.Tk;
  ref_dkdv_kernel<T><<<row_blocks(key_rows), kRefWarps * 32, 0, stream>>>(grad_out, q, k, v, lse,
                                                                          delta, dk, dv, a);
  TD_CUDA_LAUNCH_CHECK();
}

#define TD_ATTENTION_INSTANTIATE(T)                                                             \
  template bool attention_uses_tensor_cores<T>(const AttentionShape&, const void*, const void*, \
                                               const void*, const void*);                       \
  template void attention_forward<T>(const T*, const T*, const T*, T*, float*,                  \
                                     const AttentionShape&, cudaStream_t, bool);                \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*,         \
                                      const float*, T*, T*, T*, float*, const AttentionShape&,  \
                                      cudaStream_t, bool);
TD_KERNELS_FOR_FLOATING(TD_ATTENTION_INSTANTIATE)
#undef TD_ATTENTION_INSTANTIATE

}  // namespace td::kernels
