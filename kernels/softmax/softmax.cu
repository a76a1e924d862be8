// softmax / log_softmax kernels. Note [Row kernels] (src/ops/softmax.cpp) is the specification.
//
// Note [CUDA softmax kernels]: aligned rows (n a multiple of the 16-byte vector, aligned pointers)
// are held in registers (Note [Register rows]): a warp per row (four rows a block) up to 32 * 8
// vectors (1024 fp32, 2048 bf16 elements), else a block of 128 to 512 threads per row with 4
// vectors a thread (8192 fp32, 16384 bf16). Forward: one read of the row, the max and then the sum
// of exp(x - max) as two group reductions over registers (the exponentials kept for the output),
// y written. Backward: g and y read once, one reduction, dx written. Other rows take the fallback,
// one block per row (Note [Row ownership]): the forward keeps a running max and sum of exp per
// thread (online softmax) in one read, copying the row to fp32 shared memory when it fits
// (kCacheBytes), and writes y from the copy (or re-reads the row, from L2); the backward makes one
// pass for the row sum and one writing dx, with g and y in shared memory when both fit. Fixed
// reduction trees: deterministic.
#include <initializer_list>
#include <type_traits>

#include "runtime/cuda_check.cuh"
#include "softmax/row_common.cuh"
#include "softmax/row_registers.cuh"
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

// Warps per block of the warp path (one row per warp) and the largest block of the block path.
constexpr int kRowWarps = 4;
constexpr int kRegMaxThreads = 512;

// Register rows (Note [Register rows]): the max, then the sum of exp(x - max) over registers.
template <typename T, bool kLog, int kVecs, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kRowWarps * 32 : kRegMaxThreads)
    softmax_forward_regs_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n) {
  constexpr int V = kVec16<T>;
  __shared__ float red[32];
  const rows::Group<kWarp> grp;
  const int nv = n / V;
  for (int64_t r = grp.first; r < rows; r += grp.step) {
    float v[kVecs][V];
    rows::load_row<T, kVecs>(x + r * n, nv, grp, v, -INFINITY);  // not owned: -inf, exp 0
    float m[1] = {-INFINITY};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < V; ++e) m[0] = fmaxf(m[0], v[k][e]);
    }
    rows::group_reduce<kWarp, true>(m, red);
    const float shift = m[0] == -INFINITY ? 0.f : m[0];  // an all -inf row: as the CPU
    float s[1] = {0.f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float ex = expf(v[k][e] - shift);
        s[0] += ex;
        if constexpr (!kLog) v[k][e] = ex;
      }
    }
    rows::group_reduce<kWarp, false>(s, red);
    // As the CPU: (x - max) - log(sum) for log_softmax, exp(x - max) * (1 / sum) for softmax.
    const float log_s = kLog ? logf(s[0]) : 0.f, inv = kLog ? 0.f : 1.0f / s[0];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < V; ++e) v[k][e] = kLog ? (v[k][e] - shift) - log_s : v[k][e] * inv;
    }
    rows::store_row<T, kVecs>(y + r * n, nv, grp, v);
  }
}

// Register rows: g and y of a row held in registers, one reduction, dx written.
template <typename T, bool kLog, int kVecs, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kRowWarps * 32 : kRegMaxThreads)
    softmax_backward_regs_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                 T* __restrict__ dx, int64_t rows, int n) {
  constexpr int V = kVec16<T>;
  __shared__ float red[32];
  const rows::Group<kWarp> grp;
  const int nv = n / V;
  for (int64_t r = grp.first; r < rows; r += grp.step) {
    float gv[kVecs][V], yv[kVecs][V];
    rows::load_row<T, kVecs>(g + r * n, nv, grp, gv, 0.f);  // not owned: 0, adds nothing
    rows::load_row<T, kVecs>(y + r * n, nv, grp, yv, 0.f);
    float s[1] = {0.f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < V; ++e) s[0] += kLog ? gv[k][e] : gv[k][e] * yv[k][e];
    }
    rows::group_reduce<kWarp, false>(s, red);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        gv[k][e] = kLog ? gv[k][e] - expf(yv[k][e]) * s[0] : yv[k][e] * (gv[k][e] - s[0]);
      }
    }
    rows::store_row<T, kVecs>(dx + r * n, nv, grp, gv);
  }
}

// Launches the register-row kernel K<kVecs, kWarp> for rows of n elements when they allow it:
// returns false (nothing launched) for unaligned or too long rows.
template <typename T, typename Launch>
bool launch_regs(int64_t n, std::initializer_list<const void*> ps, Launch&& launch) {
  if (!rows::rows_vectorizable<T>(n, ps)) return false;
  const int64_t nv = n / kVec16<T>;
  if (const int k = rows::warp_vecs(nv); k > 0) {
    rows::with_warp_vecs(k, [&](auto kv) {
      launch(kv, std::true_type{}, kRowWarps * 32,
             [](int64_t rows) { return rows::row_blocks(ceil_div(rows, kRowWarps)); });
    });
  } else if (const int t = rows::block_threads(nv, kRegMaxThreads); t > 0) {
    launch(std::integral_constant<int, rows::kBlockVecs>{}, std::false_type{}, t,
           [](int64_t rows) { return rows::row_blocks(rows); });
  } else {
    return false;
  }
  TD_CUDA_LAUNCH_CHECK();
  return true;
}

template <typename T, bool kLog>
void launch_forward(const T* x, T* y, int64_t rows, int64_t n, cudaStream_t stream) {
  const bool regs = launch_regs<T>(n, {x, y}, [&](auto k, auto warp, int threads, auto grid) {
    softmax_forward_regs_kernel<T, kLog, decltype(k)::value, decltype(warp)::value>
        <<<grid(rows), threads, 0, stream>>>(x, y, rows, static_cast<int>(n));
  });
  if (regs) return;
  // Fallback: unaligned or very long rows.
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
  const bool regs = launch_regs<T>(n, {g, y, dx}, [&](auto k, auto warp, int threads, auto grid) {
    softmax_backward_regs_kernel<T, kLog, decltype(k)::value, decltype(warp)::value>
        <<<grid(rows), threads, 0, stream>>>(g, y, dx, rows, static_cast<int>(n));
  });
  if (regs) return;
  // Fallback: unaligned or very long rows.
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
