#pragma once
// Rows held in registers: the building blocks of the fast paths of the row kernels in
// kernels/norm and kernels/softmax (device code only; include from .cu files).
//
// Note [Register rows]: a row of n elements (n a multiple of V = kVec16<T>, every row pointer
// 16-byte aligned) is nv = n / V vectors of 16 bytes. A *group* of `width` threads owns one row at
// a time: either one warp (width 32; a block holds several groups, one row each) or the whole
// block (width blockDim.x). Thread `lane` of the group owns the vectors lane + k * width for
// k < kVecs, a compile-time count, so the row lives in registers after kVecs independent 16-byte
// loads per thread (all in flight at once) and is never re-read: the statistics are passes over
// registers and the store follows. Consecutive lanes read consecutive vectors (coalesced).
// Vectors past the row's end (lane + k * width >= nv) are not loaded and are excluded from every
// sum by `owns`. Group reductions use fixed butterfly trees (and, for a block, a fixed order over
// its warps): deterministic, and every lane of the group gets the same bits.
//
// Dispatch (host side): a row of nv <= 32 * 8 vectors goes to the warp path with kVecs the
// smallest of kWarpVecs covering it; a longer row of up to kBlockVecs * (block size) vectors to the
// block path; anything longer, or unaligned, to the family's shared-memory fallback.
#include <type_traits>

#include "common/cuda_types.cuh"

namespace td::kernels::rows {

// Vectors per thread instantiated for the warp path (a row of up to 32 * 8 vectors: 1024 fp32 or
// 2048 bf16 / fp16 elements); 3 and 6 fit GPT-2's 768 exactly (bf16 and fp32).
inline constexpr int kWarpVecs[] = {1, 2, 3, 4, 6, 8};
inline constexpr int kMaxWarpVecs = 8;
// Vectors per thread of the block path.
inline constexpr int kBlockVecs = 4;

// The warp path's vectors per thread for a row of nv vectors, or 0 when the row needs more.
inline int warp_vecs(int64_t nv) {
  for (int k : kWarpVecs) {
    if (nv <= 32 * int64_t{k}) return k;
  }
  return 0;
}

// Threads of the block path for a row of nv vectors, `vecs` each: the smallest of 128, 256, ...,
// max_threads that covers the row, or 0 when none does.
inline int block_threads(int64_t nv, int max_threads, int vecs = kBlockVecs) {
  for (int t = 128; t <= max_threads; t *= 2) {
    if (nv <= int64_t{t} * vecs) return t;
  }
  return 0;
}

// Calls f(std::integral_constant<int, k>{}) for k one of kWarpVecs; only k <= kMax are
// instantiated (a larger k is a caller's error and does nothing).
template <int kMax = kMaxWarpVecs, typename F>
void with_warp_vecs(int k, F&& f) {
  auto call = [&](auto kv) {
    if constexpr (decltype(kv)::value <= kMax) {
      if (k == decltype(kv)::value) f(kv);
    }
  };
  call(std::integral_constant<int, 1>{});
  call(std::integral_constant<int, 2>{});
  call(std::integral_constant<int, 3>{});
  call(std::integral_constant<int, 4>{});
  call(std::integral_constant<int, 6>{});
  call(std::integral_constant<int, 8>{});
}

// The group a thread belongs to: `lane` within the group, the group's `width`, and the row
// schedule (first row, stride) of a grid-stride loop in which each group takes one row.
template <bool kWarp>
struct Group {
  int lane, width;
  int64_t first, step;
  __device__ __forceinline__ Group() {
    if constexpr (kWarp) {
      const int groups = static_cast<int>(blockDim.x >> 5);
      lane = static_cast<int>(threadIdx.x & 31);
      width = 32;
      first = static_cast<int64_t>(blockIdx.x) * groups + (threadIdx.x >> 5);
      step = static_cast<int64_t>(gridDim.x) * groups;
    } else {
      lane = static_cast<int>(threadIdx.x);
      width = static_cast<int>(blockDim.x);
      first = blockIdx.x;
      step = gridDim.x;
    }
  }
  // Whether this thread owns vector k of a row of nv vectors.
  __device__ __forceinline__ bool owns(int k, int nv) const { return lane + k * width < nv; }
  // Index (in vectors) of this thread's vector k.
  __device__ __forceinline__ int vec_index(int k) const { return lane + k * width; }
};

// v[i] = the sum (kMax: the max) of v[i] over the threads of the group, for each i < K; every
// thread of the group gets the same bits. The block version (kWarp false) needs `shared` of
// 32 * K floats and must be called by every thread of the block.
template <bool kWarp, bool kMax, int K>
__device__ __forceinline__ void group_reduce(float (&v)[K], float* shared) {
#pragma unroll
  for (int i = 0; i < K; ++i) v[i] = kMax ? warp_max(v[i]) : warp_sum(v[i]);
  if constexpr (!kWarp) {
    const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
    const int warps = static_cast<int>(blockDim.x >> 5);
    __syncthreads();  // `shared` may still be read by a previous call
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < K; ++i) shared[i * 32 + warp] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const float identity = kMax ? -INFINITY : 0.f;
      const float t = lane < warps ? shared[i * 32 + lane] : identity;
      v[i] = kMax ? warp_max(t) : warp_sum(t);
    }
  }
}

// The 16-byte vectors of T and their fp32 values.
template <typename T>
using Vec16 = Vec<T, kVec16<T>>;

template <typename T>
__device__ __forceinline__ void to_floats(const Vec16<T>& p, float (&out)[kVec16<T>]) {
#pragma unroll
  for (int e = 0; e < kVec16<T>; ++e) out[e] = to_float(p.v[e]);
}

// Loads this thread's vectors of a row (as fp32); vectors it does not own are set to `fill`.
template <typename T, int kVecs, bool kWarp>
__device__ __forceinline__ void load_row(const T* row, int nv, const Group<kWarp>& grp,
                                         float (&out)[kVecs][kVec16<T>], float fill) {
  const auto* rv = reinterpret_cast<const Vec16<T>*>(row);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    if (grp.owns(k, nv)) {
      to_floats<T>(rv[grp.vec_index(k)], out[k]);
    } else {
#pragma unroll
      for (int e = 0; e < kVec16<T>; ++e) out[k][e] = fill;
    }
  }
}

// Stores this thread's vectors of a row (rounded to T) from fp32 values.
template <typename T, int kVecs, bool kWarp>
__device__ __forceinline__ void store_row(T* row, int nv, const Group<kWarp>& grp,
                                          const float (&in)[kVecs][kVec16<T>]) {
  auto* rv = reinterpret_cast<Vec16<T>*>(row);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    if (!grp.owns(k, nv)) continue;
    Vec16<T> p;
#pragma unroll
    for (int e = 0; e < kVec16<T>; ++e) p.v[e] = from_float<T>(in[k][e]);
    rv[grp.vec_index(k)] = p;
  }
}

// N consecutive fp32 values at p (16-byte aligned, N a multiple of 4) as 16-byte loads.
template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&out)[N]) {
  static_assert(N % 4 == 0, "whole float4s");
  const auto* p4 = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 q = p4[i];
    out[4 * i] = q.x;
    out[4 * i + 1] = q.y;
    out[4 * i + 2] = q.z;
    out[4 * i + 3] = q.w;
  }
}
template <int N>
__device__ __forceinline__ void store_floats(float* p, const float (&in)[N]) {
  static_assert(N % 4 == 0, "whole float4s");
  auto* p4 = reinterpret_cast<float4*>(p);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    p4[i] = make_float4(in[4 * i], in[4 * i + 1], in[4 * i + 2], in[4 * i + 3]);
  }
}

}  // namespace td::kernels::rows
