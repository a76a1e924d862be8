#pragma once
// Row-wise building blocks shared by the row kernels of kernels/norm, kernels/softmax and
// kernels/loss (device code only; include from .cu files).
//
// Note [Row ownership]: a block works on one contiguous row of n elements at a time. With `vec`
// (n a multiple of V = kVec16<T> and every row pointer 16-byte aligned) thread t owns the
// V-element vectors t, t + blockDim.x, ...; otherwise it owns the elements t, t + blockDim.x,
// ... Every helper below walks the same owned elements in the same order, so a value a thread
// stores in shared memory for element j in one pass is read back by that same thread in a later
// pass: no __syncthreads is needed between such passes, and per-thread sums have a fixed order
// (results are deterministic).
#include <initializer_list>

#include "common/cuda_types.cuh"

namespace td::kernels::rows {

// Threads per block for rows of n elements taken V at a time: one vector per thread up to
// max_threads, a multiple of 32, at least one warp.
inline int threads_for_row(int64_t n, int v, int max_threads = 512) {
  int64_t t = ceil_div(ceil_div(n, v), 32) * 32;
  if (t < 32) t = 32;
  if (t > max_threads) t = max_threads;
  return static_cast<int>(t);
}

// Blocks for a grid-stride loop over `rows` rows (one block per row up to a large cap).
inline unsigned row_blocks(int64_t rows) {
  constexpr int64_t kMax = int64_t{1} << 20;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > kMax ? kMax : rows));
}

// True when rows of n elements starting at each of `ps` can use 16-byte vectors.
template <typename T>
inline bool rows_vectorizable(int64_t n, std::initializer_list<const void*> ps) {
  if (n % kVec16<T> != 0) return false;
  for (const void* p : ps) {
    if (p != nullptr && !is_aligned<16>(p)) return false;
  }
  return true;
}

// f(j) for every element j this thread owns.
template <typename T, typename F>
__device__ __forceinline__ void for_owned(int64_t n, bool vec, F&& f) {
  constexpr int V = kVec16<T>;
  if (vec) {
    for (int64_t i = threadIdx.x; i < n / V; i += blockDim.x) {
#pragma unroll
      for (int k = 0; k < V; ++k) f(i * V + k);
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) f(j);
  }
}

// f(j, a[j]) for every owned element (a read as float).
template <typename T, typename F>
__device__ __forceinline__ void for_each1(const T* a, int64_t n, bool vec, F&& f) {
  constexpr int V = kVec16<T>;
  if (vec) {
    const auto* av = reinterpret_cast<const Vec<T, V>*>(a);
    for (int64_t i = threadIdx.x; i < n / V; i += blockDim.x) {
      const Vec<T, V> pa = av[i];
#pragma unroll
      for (int k = 0; k < V; ++k) f(i * V + k, to_float(pa.v[k]));
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) f(j, to_float(a[j]));
  }
}

// f(j, a[j], b[j]) for every owned element.
template <typename T, typename F>
__device__ __forceinline__ void for_each2(const T* a, const T* b, int64_t n, bool vec, F&& f) {
  constexpr int V = kVec16<T>;
  if (vec) {
    const auto* av = reinterpret_cast<const Vec<T, V>*>(a);
    const auto* bv = reinterpret_cast<const Vec<T, V>*>(b);
    for (int64_t i = threadIdx.x; i < n / V; i += blockDim.x) {
      const Vec<T, V> pa = av[i], pb = bv[i];
#pragma unroll
      for (int k = 0; k < V; ++k) f(i * V + k, to_float(pa.v[k]), to_float(pb.v[k]));
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) f(j, to_float(a[j]), to_float(b[j]));
  }
}

// out[j] = f(j) for every owned element.
template <typename T, typename F>
__device__ __forceinline__ void map0(T* out, int64_t n, bool vec, F&& f) {
  constexpr int V = kVec16<T>;
  if (vec) {
    auto* ov = reinterpret_cast<Vec<T, V>*>(out);
    for (int64_t i = threadIdx.x; i < n / V; i += blockDim.x) {
      Vec<T, V> po;
#pragma unroll
      for (int k = 0; k < V; ++k) po.v[k] = from_float<T>(f(i * V + k));
      ov[i] = po;
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) out[j] = from_float<T>(f(j));
  }
}

// out[j] = f(j, a[j]) for every owned element.
template <typename T, typename F>
__device__ __forceinline__ void map1(const T* a, T* out, int64_t n, bool vec, F&& f) {
  constexpr int V = kVec16<T>;
  if (vec) {
    const auto* av = reinterpret_cast<const Vec<T, V>*>(a);
    auto* ov = reinterpret_cast<Vec<T, V>*>(out);
    for (int64_t i = threadIdx.x; i < n / V; i += blockDim.x) {
      const Vec<T, V> pa = av[i];
      Vec<T, V> po;
#pragma unroll
      for (int k = 0; k < V; ++k) po.v[k] = from_float<T>(f(i * V + k, to_float(pa.v[k])));
      ov[i] = po;
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      out[j] = from_float<T>(f(j, to_float(a[j])));
    }
  }
}

// out[j] = f(j, a[j], b[j]) for every owned element.
template <typename T, typename F>
__device__ __forceinline__ void map2(const T* a, const T* b, T* out, int64_t n, bool vec, F&& f) {
  constexpr int V = kVec16<T>;
  if (vec) {
    const auto* av = reinterpret_cast<const Vec<T, V>*>(a);
    const auto* bv = reinterpret_cast<const Vec<T, V>*>(b);
    auto* ov = reinterpret_cast<Vec<T, V>*>(out);
    for (int64_t i = threadIdx.x; i < n / V; i += blockDim.x) {
      const Vec<T, V> pa = av[i], pb = bv[i];
      Vec<T, V> po;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        po.v[k] = from_float<T>(f(i * V + k, to_float(pa.v[k]), to_float(pb.v[k])));
      }
      ov[i] = po;
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      out[j] = from_float<T>(f(j, to_float(a[j]), to_float(b[j])));
    }
  }
}

// Online softmax statistics of one thread: the running max m and sum of exp(x - m).
struct OnlineMaxSum {
  float m = -INFINITY, s = 0.f;
  __device__ __forceinline__ void add(float x) {
    if (x > m) {
      s = s * expf(m - x) + 1.f;  // m = -inf: s is 0 and expf(-inf) = 0
      m = x;
    } else {
      s += x == -INFINITY ? 0.f : expf(x - m);  // -inf - -inf would be NaN
    }
  }
};

// Combines the threads' statistics: returns the block's shift (the row max, or 0 for an all
// -inf row, as the CPU does) and sets *sum to sum_j exp(x_j - shift). Every thread must call it.
__device__ __forceinline__ float block_softmax_stats(const OnlineMaxSum& st, float* shared,
                                                     float* sum) {
  const float mx = block_max(st.m, shared);
  const float shift = mx == -INFINITY ? 0.f : mx;
  // s == 0 means the thread saw only -inf (or nothing); NaN stays NaN.
  const float mine = st.s == 0.f ? 0.f : st.s * expf(st.m - shift);
  *sum = block_sum(mine, shared);
  return shift;
}

}  // namespace td::kernels::rows
