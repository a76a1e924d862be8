#pragma once
// Device machinery of the elementwise engine (included by kernels/elementwise/*.cu only):
// per-operand loads and stores with conversion to the compute type, the offset calculator, a
// grid-stride strided kernel and a vectorized contiguous kernel, and launch<F, TO, TI...>().
#include <type_traits>
#include <utility>

#include "common/cuda_types.cuh"
#include "common/fp8.cuh"
#include "elementwise/elementwise.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels::ew {

// The compute type of a storage type: float for the 16-bit floats, the type itself otherwise
// (td::acc_t on the CPU).
template <typename T>
struct AccOf {
  using type = T;
};
template <>
struct AccOf<__nv_bfloat16> {
  using type = float;
};
template <>
struct AccOf<__half> {
  using type = float;
};
template <Fp8Kind K, bool S>
struct AccOf<Fp8<K, S>> {
  using type = float;
};
template <typename T>
using acc = typename AccOf<T>::type;

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;
template <typename T>
inline constexpr bool kIsFp8 = false;
template <Fp8Kind K, bool S>
inline constexpr bool kIsFp8<Fp8<K, S>> = true;

template <typename T>
__device__ __forceinline__ acc<T> load(T v) {
  if constexpr (kIsHalf<T>) {
    return to_float(v);
  } else if constexpr (kIsFp8<T>) {
    return fp8_decode<T::kKind>(v.bits);
  } else {
    return v;
  }
}

// The CPU's static_cast<TOut>(value): 16-bit floats round from float to nearest even; FP8 as
// Note [FP8 kernel conversions].
template <typename T, typename V>
__device__ __forceinline__ T store(V v) {
  if constexpr (kIsHalf<T>) {
    return from_float<T>(static_cast<float>(v));
  } else if constexpr (kIsFp8<T>) {
    return T{fp8_encode<T::kKind>(static_cast<float>(v), T::kSaturate)};
  } else {
    return static_cast<T>(v);
  }
}

template <int N>
struct Ptrs {
  char* p[N];
};

template <int N>
struct Geom {
  int ndim;
  int64_t sizes[kEwMaxDims];
  int64_t strides[N][kEwMaxDims];
};

// Per-operand element offsets of flat index i (dims innermost first). The loop is unrolled
// over the fixed maximum so the geometry stays in registers / parameter space.
template <int N>
__device__ __forceinline__ void offsets_of(const Geom<N>& g, int64_t i, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
  for (int d = 0; d < kEwMaxDims; ++d) {
    if (d == g.ndim) break;
    const int64_t q = i / g.sizes[d];
    const int64_t r = i - q * g.sizes[d];
    i = q;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += r * g.strides[k][d];
  }
}

template <typename F, typename TO, typename... TI, size_t... I>
__device__ __forceinline__ void apply_at(const Ptrs<sizeof...(TI) + 1>& p, const int64_t* off,
                                         const F& f, std::index_sequence<I...>) {
  reinterpret_cast<TO*>(p.p[0])[off[0]] =
      store<TO>(f(load(reinterpret_cast<const TI*>(p.p[I + 1])[off[I + 1]])...));
}

template <typename F, typename TO, typename... TI>
__global__ void strided_kernel(int64_t n, Geom<sizeof...(TI) + 1> g, Ptrs<sizeof...(TI) + 1> p,
                               F f) {
  constexpr int N = sizeof...(TI) + 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int64_t off[N];
    offsets_of<N>(g, i, off);
    apply_at<F, TO, TI...>(p, off, f, std::index_sequence_for<TI...>{});
  }
}

// One 16-byte (or narrower) vector per operand, kept apart by index so equal types do not clash.
template <size_t I, int V, typename T>
struct VecSlot {
  Vec<T, V> v;
};
template <int V, typename Seq, typename... T>
struct VecSlots;
template <int V, size_t... I, typename... T>
struct VecSlots<V, std::index_sequence<I...>, T...> : VecSlot<I, V, T>... {};

template <int V, typename F, typename TO, typename... TI, size_t... I>
__device__ __forceinline__ void apply_vec(const Ptrs<sizeof...(TI) + 1>& p, int64_t i, const F& f,
                                          std::index_sequence<I...>) {
  VecSlots<V, std::index_sequence<I...>, TI...> in;
  ((static_cast<VecSlot<I, V, TI>&>(in).v = reinterpret_cast<const Vec<TI, V>*>(p.p[I + 1])[i]),
   ...);
  Vec<TO, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    out.v[j] = store<TO>(f(load(static_cast<VecSlot<I, V, TI>&>(in).v.v[j])...));
  }
  reinterpret_cast<Vec<TO, V>*>(p.p[0])[i] = out;
}

// Every operand contiguous and aligned to its vector: vectors first, then the < V tail.
template <int V, typename F, typename TO, typename... TI>
__global__ void vec_kernel(int64_t n, Ptrs<sizeof...(TI) + 1> p, F f) {
  constexpr int N = sizeof...(TI) + 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = t; i < nvec; i += stride) {
    apply_vec<V, F, TO, TI...>(p, i, f, std::index_sequence_for<TI...>{});
  }
  for (int64_t i = nvec * V + t; i < n; i += stride) {
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = i;
    apply_at<F, TO, TI...>(p, off, f, std::index_sequence_for<TI...>{});
  }
}

inline constexpr int kThreads = 256;

template <typename... T>
constexpr int max_size() {
  int m = 1;
  ((m = static_cast<int>(sizeof(T)) > m ? static_cast<int>(sizeof(T)) : m), ...);
  return m;
}

// out = f(in...) over the geometry `a` (operand 0 the output, of type TO; operand k + 1 of type
// TI[k]). f receives the compute types (acc<TI>) and its result is converted to TO.
template <typename F, typename TO, typename... TI>
void launch(const EwArgs& a, const F& f, cudaStream_t stream) {
  constexpr int N = sizeof...(TI) + 1;
  static_assert(N <= kEwMaxOperands);
  if (a.numel <= 0) return;
  Ptrs<N> p;
  for (int k = 0; k < N; ++k) p.p[k] = static_cast<char*>(a.data[k]);

  constexpr int V = 16 / max_size<TO, TI...>();
  bool vec = V > 1 && a.ndim == 1;
  constexpr size_t kAlign[N] = {sizeof(TO) * V, sizeof(TI) * V...};
  for (int k = 0; k < N && vec; ++k) {
    vec = a.strides[k][0] == 1 && reinterpret_cast<uintptr_t>(p.p[k]) % kAlign[k] == 0;
  }
  if (vec) {
    vec_kernel<V, F, TO, TI...>
        <<<grid_for(ceil_div(a.numel, V), kThreads), kThreads, 0, stream>>>(a.numel, p, f);
    TD_CUDA_LAUNCH_CHECK();
    return;
  }
  Geom<N> g;
  g.ndim = a.ndim;
  for (int d = 0; d < kEwMaxDims; ++d) {
    g.sizes[d] = a.sizes[d];
    for (int k = 0; k < N; ++k) g.strides[k][d] = a.strides[k][d];
  }
  strided_kernel<F, TO, TI...>
      <<<grid_for(a.numel, kThreads), kThreads, 0, stream>>>(a.numel, g, p, f);
  TD_CUDA_LAUNCH_CHECK();
}

// Calls body.template operator()<T>() with the storage type of t (float, __nv_bfloat16, __half,
// int32_t, int64_t, bool).
template <typename Body>
void dispatch_all(EwType t, Body&& body) {
  switch (t) {
    case EwType::F32:
      return body.template operator()<float>();
    case EwType::BF16:
      return body.template operator()<__nv_bfloat16>();
    case EwType::F16:
      return body.template operator()<__half>();
    case EwType::I32:
      return body.template operator()<int32_t>();
    case EwType::I64:
      return body.template operator()<int64_t>();
    case EwType::Bool:
      return body.template operator()<bool>();
  }
}

}  // namespace td::kernels::ew

namespace td::kernels::ew {

// fp32 products, sums and differences rounded one at a time (never contracted into an FMA), as
// the CPU backend computes them; integers use the plain operators.
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ float sub_rn(float a, float b) {
  return __fsub_rn(a, b);
}
template <typename A>
__device__ __forceinline__ A mul_rn(A a, A b) {
  return a * b;
}
template <typename A>
__device__ __forceinline__ A add_rn(A a, A b) {
  return a + b;
}
template <typename A>
__device__ __forceinline__ A sub_rn(A a, A b) {
  return a - b;
}

}  // namespace td::kernels::ew
