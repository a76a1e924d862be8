#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/cuda_types.cuh"
#include "reduction/reduction.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {
namespace {

// See Note [CUDA reduction order] in reduction.cuh.
constexpr int kThreads = 256;  // row kernels: 8 warps a block
constexpr int kWarp = 32;
constexpr int kColX = 32, kColY = 8;  // inner > 1: 32 columns x 8 interleaved slices of r
constexpr int64_t kMaxGrid = 65535LL * 8;
constexpr int64_t kTargetBlocks = 2048;  // split r only while fewer work units than this exist
constexpr int64_t kMinRowChunk = 4096;   // a split row chunk is at least this long
constexpr int64_t kMinColChunk = 256;    // (inner > 1: 32 per thread of the 8 slices)
constexpr int64_t kBlockRowMin = 4096;   // rows this long get a block each, shorter ones a warp

template <typename T>
inline constexpr bool kIsFloat =
    std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

__host__ __device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

struct Split {
  int64_t nsplit, chunk;
};

// How r is cut into chunks: a function of the shape only (determinism).
Split split_for(ReduceDims d) {
  if (d.r <= 0) return {1, 0};
  int64_t units, min_chunk;
  if (d.inner == 1) {
    units = d.outer;
    min_chunk = kMinRowChunk;
  } else {
    units = d.outer * ceil_div(d.inner, kColX);
    min_chunk = kMinColChunk;
  }
  int64_t ns =
      std::min(ceil_div(kTargetBlocks, std::max<int64_t>(units, 1)), ceil_div(d.r, min_chunk));
  ns = std::max<int64_t>(ns, 1);
  const int64_t chunk = ceil_div(d.r, ns);
  return {ceil_div(d.r, chunk), chunk};
}

constexpr size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}
constexpr size_t kMaxAccBytes = 16;

// ---- accumulators and their combine operations ----

template <typename A>
struct SumOp {
  __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};

// An extremum candidate: value (double for floating inputs, exact; int64 for integers and bool)
// and its position along r; i < 0 marks the empty identity.
template <typename V>
struct ExtAcc {
  V v;
  int64_t i;
};

// Picks the preferred of two candidates: a NaN, else the larger (smaller) value, ties and two
// NaNs to the smaller index. A total order, so the result does not depend on the grouping and
// is the first extremum, as on the CPU (Note [Extremum NaN] in src/ops/reduction.cpp).
template <typename V>
struct ExtOp {
  bool is_max;
  __device__ __forceinline__ ExtAcc<V> operator()(ExtAcc<V> a, ExtAcc<V> b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if constexpr (std::is_floating_point_v<V>) {
      const bool na = a.v != a.v, nb = b.v != b.v;
      if (na || nb) return (na && nb) ? (a.i < b.i ? a : b) : (na ? a : b);
    }
    if (a.v == b.v) return a.i < b.i ? a : b;
    return (is_max ? a.v > b.v : a.v < b.v) ? a : b;
  }
};

template <typename V, typename T>
__device__ __forceinline__ V ext_value(T x) {
  if constexpr (kIsFloat<T>) {
    return static_cast<double>(to_float(x));
  } else {
    return static_cast<int64_t>(x);
  }
}

template <typename T, typename V>
__device__ __forceinline__ T from_ext(V v) {
  if constexpr (kIsFloat<T>) {
    return from_float<T>(static_cast<float>(v));  // exact: v came from a T
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else {
    return static_cast<T>(v);
  }
}

// ---- sources: element (o, k, c) of the [outer, r, inner] input as an accumulator ----

template <typename T, typename A>
struct LoadSum {
  const T* x;
  int64_t r, inner;
  __device__ __forceinline__ A operator()(int64_t o, int64_t k, int64_t c) const {
    const T v = x[(o * r + k) * inner + c];
    if constexpr (std::is_same_v<A, double>) {
      return static_cast<double>(to_float(v));
    } else {
      return static_cast<int64_t>(v);
    }
  }
};

template <typename T>
struct LoadSquare {
  const T* x;
  int64_t r, inner;
  __device__ __forceinline__ double operator()(int64_t o, int64_t k, int64_t c) const {
    const double v = to_float(x[(o * r + k) * inner + c]);
    return v * v;
  }
};

template <typename T>
struct LoadCentredSquare {
  const T* x;
  const double* mean;  // [outer, inner]
  int64_t r, inner;
  __device__ __forceinline__ double operator()(int64_t o, int64_t k, int64_t c) const {
    const double v = to_float(x[(o * r + k) * inner + c]);
    const double dv = v - mean[o * inner + c];
    return dv * dv;
  }
};

template <typename T, typename V>
struct LoadExt {
  const T* x;
  int64_t r, inner;
  __device__ __forceinline__ ExtAcc<V> operator()(int64_t o, int64_t k, int64_t c) const {
    return ExtAcc<V>{ext_value<V>(x[(o * r + k) * inner + c]), k};
  }
};

// Partials of a split reduction: [outer, nsplit, inner] accumulators (k is the chunk).
template <typename A>
struct LoadPartial {
  const A* p;
  int64_t nsplit, inner;
  __device__ __forceinline__ A operator()(int64_t o, int64_t k, int64_t c) const {
    return p[(o * nsplit + k) * inner + c];
  }
};

// ---- destinations: the reduced value of (o, chunk s, c) ----

template <typename A>
struct StorePartial {
  A* p;
  int64_t nsplit, inner;
  __device__ __forceinline__ void operator()(int64_t o, int64_t s, int64_t c, A a) const {
    p[(o * nsplit + s) * inner + c] = a;
  }
};

template <typename TO, typename A>
struct StoreSum {
  TO* out;
  int64_t inner;
  double scale;
  __device__ __forceinline__ void operator()(int64_t o, int64_t, int64_t c, A a) const {
    if constexpr (kIsFloat<TO>) {
      out[o * inner + c] = from_float<TO>(static_cast<float>(a * scale));
    } else {
      out[o * inner + c] = a;  // integer sums: scale is 1
    }
  }
};

struct StoreMean {
  double* mean;
  int64_t inner;
  double count;
  __device__ __forceinline__ void operator()(int64_t o, int64_t, int64_t c, double a) const {
    mean[o * inner + c] = a / count;
  }
};

template <typename T>
struct StoreVar {
  T* out;
  int64_t inner;
  double divisor;
  __device__ __forceinline__ void operator()(int64_t o, int64_t, int64_t c, double a) const {
    out[o * inner + c] = from_float<T>(static_cast<float>(a / divisor));
  }
};

template <typename T>
struct StoreNorm {
  T* out;
  __device__ __forceinline__ void operator()(int64_t, int64_t, int64_t, double a) const {
    out[0] = from_float<T>(static_cast<float>(sqrt(a)));
  }
};

template <typename T, typename V>
struct StoreExt {
  T* values;
  int64_t* indices;  // may be null
  int64_t inner;
  __device__ __forceinline__ void operator()(int64_t o, int64_t, int64_t c, ExtAcc<V> a) const {
    values[o * inner + c] = from_ext<T>(a.v);
    if (indices) indices[o * inner + c] = a.i;
  }
};

// ---- the kernels ----

// Any trivially copyable accumulator through a warp shuffle, 32 bits at a time.
template <typename A>
__device__ __forceinline__ A shfl_xor_any(A v, int mask) {
  static_assert(sizeof(A) % 4 == 0, "accumulators are whole 32-bit words");
  constexpr int kWords = sizeof(A) / 4;
  int w[kWords];
  memcpy(w, &v, sizeof(A));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_xor_sync(0xffffffffu, w[i], mask);
  A r;
  memcpy(&r, w, sizeof(A));
  return r;
}

// Fixed butterfly over the 32 lanes (all must be active); lane 0 holds the result.
template <typename A, typename Op>
__device__ __forceinline__ A warp_reduce(A v, const Op& op) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = op(v, shfl_xor_any(v, o));
  return v;
}

// Whole-block reduction (every thread must call it); thread 0 holds the result.
template <typename A, typename Op>
__device__ __forceinline__ A block_reduce(A v, const Op& op, A init, A* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_reduce(v, op);
  __syncthreads();  // readers of `shared` from the previous item are done
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : init;
    v = warp_reduce(v, op);
  }
  return v;
}

// acc combined with src(o, k, c), src(o, k + stride, c), ... below `end`, in increasing k; four
// loads are issued before they are combined (same order, more memory parallelism).
template <typename A, typename Op, typename Src>
__device__ __forceinline__ A accumulate(const Src& src, const Op& op, A acc, int64_t o, int64_t k,
                                        int64_t end, int64_t c, int64_t stride) {
  for (; k + 3 * stride < end; k += 4 * stride) {
    const A v0 = src(o, k, c), v1 = src(o, k + stride, c);
    const A v2 = src(o, k + 2 * stride, c), v3 = src(o, k + 3 * stride, c);
    acc = op(acc, v0);
    acc = op(acc, v1);
    acc = op(acc, v2);
    acc = op(acc, v3);
  }
  for (; k < end; k += stride) acc = op(acc, src(o, k, c));
  return acc;
}

// inner == 1, short chunks: one warp per (row o, chunk s) item.
template <typename A, typename Op, typename Src, typename Dst>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_warp_kernel(Src src, Dst dst, Op op, A init, int64_t items, int64_t nsplit,
                            int64_t r, int64_t chunk) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = blockDim.x / kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps;
  for (int64_t item = blockIdx.x * warps + threadIdx.x / kWarp; item < items; item += stride) {
    const int64_t o = item / nsplit, s = item % nsplit;
    const int64_t r0 = s * chunk, r1 = imin(r, r0 + chunk);
    A acc = accumulate(src, op, init, o, r0 + lane, r1, 0, kWarp);
    acc = warp_reduce(acc, op);
    if (lane == 0) dst(o, s, 0, acc);
  }
}

// inner == 1, long chunks: one block per item (the item loop is uniform across the block).
template <typename A, typename Op, typename Src, typename Dst>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_block_kernel(Src src, Dst dst, Op op, A init, int64_t items, int64_t nsplit,
                             int64_t r, int64_t chunk) {
  __shared__ A shared[kThreads / kWarp];
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t o = item / nsplit, s = item % nsplit;
    const int64_t r0 = s * chunk, r1 = imin(r, r0 + chunk);
    A acc = accumulate(src, op, init, o, r0 + threadIdx.x, r1, 0, blockDim.x);
    acc = block_reduce(acc, op, init, shared);
    if (threadIdx.x == 0) dst(o, s, 0, acc);
  }
}

// inner > 1: a block takes 32 adjacent columns (coalesced) of one (o, chunk s); its 8 thread
// rows take interleaved slices of the chunk, combined in slice order through shared memory.
template <typename A, typename Op, typename Src, typename Dst>
__global__ void __launch_bounds__(kColX* kColY)
    reduce_cols_kernel(Src src, Dst dst, Op op, A init, int64_t outer, int64_t nsplit, int64_t r,
                       int64_t chunk, int64_t inner) {
  __shared__ A shared[kColY][kColX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles = ceil_div(inner, kColX);
  const int64_t items = outer * nsplit * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t tile = item % tiles, t = item / tiles;
    const int64_t s = t % nsplit, o = t / nsplit;
    const int64_t c = tile * kColX + tx;
    const int64_t r0 = s * chunk, r1 = imin(r, r0 + chunk);
    A acc = init;
    if (c < inner) acc = accumulate(src, op, init, o, r0 + ty, r1, c, kColY);
    shared[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < inner) {
      A a = shared[0][tx];
      for (int k = 1; k < kColY; ++k) a = op(a, shared[k][tx]);
      dst(o, s, c, a);
    }
    __syncthreads();  // shared is rewritten by the next item
  }
}

// One pass: dst(o, s, c) = reduction of src(o, k, c) over k in chunk s (nsplit chunks).
template <typename A, typename Op, typename Src, typename Dst>
void launch_pass(Src src, Dst dst, Op op, A init, int64_t outer, int64_t nsplit, int64_t r,
                 int64_t chunk, int64_t inner, cudaStream_t stream) {
  if (inner == 1) {
    const int64_t items = outer * nsplit;
    if (imin(chunk, r) >= kBlockRowMin) {
      const auto grid = static_cast<unsigned>(imin(items, kMaxGrid));
      reduce_rows_block_kernel<A>
          <<<grid, kThreads, 0, stream>>>(src, dst, op, init, items, nsplit, r, chunk);
    } else {
      const auto grid = static_cast<unsigned>(imin(ceil_div(items, kThreads / kWarp), kMaxGrid));
      reduce_rows_warp_kernel<A>
          <<<grid, kThreads, 0, stream>>>(src, dst, op, init, items, nsplit, r, chunk);
    }
  } else {
    const int64_t items = outer * nsplit * ceil_div(inner, kColX);
    const auto grid = static_cast<unsigned>(imin(items, kMaxGrid));
    reduce_cols_kernel<A><<<grid, dim3(kColX, kColY), 0, stream>>>(src, dst, op, init, outer,
                                                                   nsplit, r, chunk, inner);
  }
  TD_CUDA_LAUNCH_CHECK();
}

// The whole reduction: one pass, or chunk partials into scratch and a second pass over them.
template <typename A, typename Op, typename Src, typename Dst>
void reduce(ReduceDims d, Src src, Dst dst, Op op, A init, void* scratch, cudaStream_t stream) {
  static_assert(sizeof(A) <= kMaxAccBytes);
  const Split sp = split_for(d);
  if (sp.nsplit == 1) {
    launch_pass(src, dst, op, init, d.outer, 1, d.r, d.r, d.inner, stream);
    return;
  }
  A* part = static_cast<A*>(scratch);
  launch_pass(src, StorePartial<A>{part, sp.nsplit, d.inner}, op, init, d.outer, sp.nsplit, d.r,
              sp.chunk, d.inner, stream);
  launch_pass(LoadPartial<A>{part, sp.nsplit, d.inner}, dst, op, init, d.outer, 1, sp.nsplit,
              sp.nsplit, d.inner, stream);
}

size_t partial_bytes(ReduceDims d) {
  const Split sp = split_for(d);
  if (sp.nsplit == 1) return 0;
  return align256(static_cast<size_t>(d.outer * sp.nsplit * d.inner) * kMaxAccBytes);
}

template <typename T>
__global__ void max_backward_rows_kernel(const T* g, const int64_t* idx, T* z, int64_t rows,
                                         int64_t n) {
  const int64_t total = rows * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t i = e / n, j = e % n;
    z[e] = j == idx[i] ? g[i] : from_float<T>(0.f);
  }
}

}  // namespace

size_t reduce_scratch_bytes(ReduceDims d, bool for_var) {
  size_t n = partial_bytes(d);
  if (for_var) n += align256(static_cast<size_t>(d.outer * d.inner) * sizeof(double));
  return n;
}

template <typename T>
void reduce_sum(const T* x, sum_out_t<T>* out, ReduceDims d, double scale, void* scratch,
                cudaStream_t stream) {
  using A = std::conditional_t<kIsFloat<T>, double, int64_t>;
  reduce<A>(d, LoadSum<T, A>{x, d.r, d.inner}, StoreSum<sum_out_t<T>, A>{out, d.inner, scale},
            SumOp<A>{}, A(0), scratch, stream);
}

template <typename T>
void reduce_extremum(const T* x, T* values, int64_t* indices, ReduceDims d, bool is_max,
                     void* scratch, cudaStream_t stream) {
  using V = std::conditional_t<kIsFloat<T>, double, int64_t>;
  reduce<ExtAcc<V>>(d, LoadExt<T, V>{x, d.r, d.inner}, StoreExt<T, V>{values, indices, d.inner},
                    ExtOp<V>{is_max}, ExtAcc<V>{V(0), -1}, scratch, stream);
}

template <typename T>
void reduce_var(const T* x, T* out, ReduceDims d, double divisor, void* scratch,
                cudaStream_t stream) {
  double* mean = reinterpret_cast<double*>(static_cast<char*>(scratch) + partial_bytes(d));
  reduce<double>(d, LoadSum<T, double>{x, d.r, d.inner},
                 StoreMean{mean, d.inner, static_cast<double>(d.r)}, SumOp<double>{}, 0.0, scratch,
                 stream);
  reduce<double>(d, LoadCentredSquare<T>{x, mean, d.r, d.inner}, StoreVar<T>{out, d.inner, divisor},
                 SumOp<double>{}, 0.0, scratch, stream);
}

template <typename T>
void reduce_norm(const T* x, T* out, int64_t n, void* scratch, cudaStream_t stream) {
  const ReduceDims d{1, n, 1};
  reduce<double>(d, LoadSquare<T>{x, d.r, d.inner}, StoreNorm<T>{out}, SumOp<double>{}, 0.0,
                 scratch, stream);
}

template <typename T>
void max_backward_rows(const T* g, const int64_t* idx, T* z, int64_t rows, int64_t n,
                       cudaStream_t stream) {
  if (rows * n == 0) return;
  max_backward_rows_kernel<T>
      <<<grid_for(rows * n, kThreads), kThreads, 0, stream>>>(g, idx, z, rows, n);
  TD_CUDA_LAUNCH_CHECK();
}

#define TD_REDUCTION_ALL(T)                                                                      \
  template void reduce_sum<T>(const T*, sum_out_t<T>*, ReduceDims, double, void*, cudaStream_t); \
  template void reduce_extremum<T>(const T*, T*, int64_t*, ReduceDims, bool, void*, cudaStream_t);
#define TD_REDUCTION_FLOATING(T)                                                      \
  template void reduce_var<T>(const T*, T*, ReduceDims, double, void*, cudaStream_t); \
  template void reduce_norm<T>(const T*, T*, int64_t, void*, cudaStream_t);           \
  template void max_backward_rows<T>(const T*, const int64_t*, T*, int64_t, int64_t, cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_REDUCTION_ALL)
TD_REDUCTION_ALL(int32_t)
TD_REDUCTION_ALL(int64_t)
TD_REDUCTION_ALL(bool)
TD_KERNELS_FOR_FLOATING(TD_REDUCTION_FLOATING)
#undef TD_REDUCTION_ALL
#undef TD_REDUCTION_FLOATING

}  // namespace td::kernels
