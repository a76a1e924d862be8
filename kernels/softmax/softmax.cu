// softmax / log_softmax kernels. Note [Row kernels] (src/ops/softmax.cpp) is the specification.
//
// Note [CUDA softmax kernels]: one block per row (Note [Row ownership]). Forward: one read of
// the row (16-byte loads when aligned) keeps a running max and sum of exp per thread (online
// softmax), copying the row to fp32 shared memory when it fits (kCacheBytes); the block then
// combines the (max, sum) pairs and writes y from the shared copy (or re-reads the row, from
// L2, when it did not fit). Backward: one pass for the row sum, one pass writing dx, with g and
// y held in shared memory when both fit. Fixed reduction trees: deterministic.
#include "runtime/cuda_check.cuh"
#include "softmax/row_common.cuh"
#include "softmax/softmax.cuh"

namespace td::kernels {

namespace {

constexpr int kMaxThreads = 512;
constexpr size_t kCacheBytes = 47 * 1024;  // default dynamic shared memory less static

template <typename T, bool kLog, bool kCache>
__global__ void softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                       int64_t n, bool vec) {
  extern __shared__ float cache[];
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    rows::OnlineMaxSum st;
    rows::for_each1(xr, n, vec, [&](int64_t j, float v) {
      if constexpr (kCache) cache[j] = v;
      st.add(v);
    });
    float sum = 0.f;
    const float shift = rows::block_softmax_stats(st, red, &sum);
    // As the CPU: (x - max) - log(sum) for log_softmax, exp(x - max) * (1 / sum) for softmax.
    const float log_s = kLog ? logf(sum) : 0.f, inv = kLog ? 0.f : 1.0f / sum;
    auto out = [&](float v) {
      if constexpr (kLog) {
        return (v - shift) - log_s;
      } else {
        return expf(v - shift) * inv;
      }
    };
    if constexpr (kCache) {
      rows::map0(yr, n, vec, [&](int64_t j) { return out(cache[j]); });
    } else {
      rows::map1(xr, yr, n, vec, [&](int64_t, float v) { return out(v); });
    }
  }
}

template <typename T, bool kLog, bool kCache>
__global__ void softmax_backward_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                        T* __restrict__ dx, int64_t rows, int64_t n, bool vec) {
  extern __shared__ float cache[];  // kCache: g row [n], then y row [n]
  __shared__ float red[32];
  float* cg = cache;
  float* cy = cache + n;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    float s = 0.f;
    rows::for_each2(gr, yr, n, vec, [&](int64_t j, float gv, float yv) {
      if constexpr (kCache) {
        cg[j] = gv;
        cy[j] = yv;
      }
      s += kLog ? gv : gv * yv;
    });
    s = block_sum(s, red);
    auto out = [&](float gv, float yv) {
      if constexpr (kLog) {
        return gv - expf(yv) * s;
      } else {
        return yv * (gv - s);
      }
    };
    if constexpr (kCache) {
      rows::map0(dx + r * n, n, vec, [&](int64_t j) { return out(cg[j], cy[j]); });
    } else {
      rows::map2(gr, yr, dx + r * n, n, vec,
                 [&](int64_t, float gv, float yv) { return out(gv, yv); });
    }
  }
}

template <typename T, bool kLog>
void launch_forward(const T* x, T* y, int64_t rows, int64_t n, cudaStream_t stream) {
  const bool vec = rows::rows_vectorizable<T>(n, {x, y});
  const int threads = rows::threads_for_row(n, vec ? kVec16<T> : 1, kMaxThreads);
  const unsigned grid = rows::row_blocks(rows);
  const size_t cache = static_cast<size_t>(n) * sizeof(float);
  if (cache <= kCacheBytes) {
    softmax_forward_kernel<T, kLog, true><<<grid, threads, cache, stream>>>(x, y, rows, n, vec);
  } else {
    softmax_forward_kernel<T, kLog, false><<<grid, threads, 0, stream>>>(x, y, rows, n, vec);
  }
  TD_CUDA_LAUNCH_CHECK();
}

template <typename T, bool kLog>
void launch_backward(const T* g, const T* y, T* dx, int64_t rows, int64_t n, cudaStream_t stream) {
  const bool vec = rows::rows_vectorizable<T>(n, {g, y, dx});
  const int threads = rows::threads_for_row(n, vec ? kVec16<T> : 1, kMaxThreads);
  const unsigned grid = rows::row_blocks(rows);
  const size_t cache = 2 * static_cast<size_t>(n) * sizeof(float);
  if (cache <= kCacheBytes) {
    softmax_backward_kernel<T, kLog, true>
        <<<grid, threads, cache, stream>>>(g, y, dx, rows, n, vec);
  } else {
    softmax_backward_kernel<T, kLog, false><<<grid, threads, 0, stream>>>(g, y, dx, rows, n, vec);
  }
  TD_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t n, bool log, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  if (log) {
    launch_forward<T, true>(x, y, rows, n, stream);
  } else {
    launch_forward<T, false>(x, y, rows, n, stream);
  }
}

template <typename T>
void softmax_backward(const T* g, const T* y, T* dx, int64_t rows, int64_t n, bool log,
                      cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  if (log) {
    launch_backward<T, true>(g, y, dx, rows, n, stream);
  } else {
    launch_backward<T, false>(g, y, dx, rows, n, stream);
  }
}

#define TD_INSTANTIATE_SOFTMAX(T)                                                       \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, bool, cudaStream_t); \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, bool, cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_INSTANTIATE_SOFTMAX)
#undef TD_INSTANTIATE_SOFTMAX

}  // namespace td::kernels
