#pragma once
// Shared device-side helpers of the kernel families (kernels/<family>/): element types and their
// fp32 conversions, aligned vectors for 16-byte loads, warp and block reductions, launch sizes.
// Header-only; depends on nothing outside the CUDA toolkit.
//
// Note [Kernel element types]: kernels are templates over the storage type T (float,
// __nv_bfloat16, __half) and compute in fp32 (`to_float` / `from_float`). Rounding back to bf16
// or fp16 is round-to-nearest-even, exactly what the CPU backend's td::BFloat16 / td::Float16
// conversions do, so an op whose fp32 math agrees to the last bit also agrees after rounding.
// Templates are instantiated explicitly in their family's .cu (TD_KERNELS_FOR_FLOATING below),
// never in headers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// N elements of T loaded or stored as one 16-byte (or smaller) transaction. Pointers must be
// aligned to sizeof(Vec); callers check alignment and fall back to scalar code otherwise.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};
// Elements per 16-byte vector.
template <typename T>
inline constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

template <int Bytes>
__host__ __device__ inline bool is_aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % Bytes) == 0;
}

// Sums over the 32 lanes of a warp; every lane gets the result. The butterfly order is fixed,
// so the result is deterministic.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `shared` must hold 32 floats. Deterministic (fixed tree). Contains __syncthreads, so
// every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// Grid size for a grid-stride loop over n items with `threads` per block: enough blocks to fill
// the device several times over, never more than the work needs.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 8) {
  int64_t b = ceil_div(n, threads);
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

}  // namespace td::kernels

// Explicit instantiation for the three floating storage types: MACRO(float), ...
#define TD_KERNELS_FOR_FLOATING(MACRO) \
  MACRO(float)                         \
  MACRO(__nv_bfloat16)                 \
  MACRO(__half)
