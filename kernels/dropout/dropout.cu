#include "common/cuda_types.cuh"
#include "dropout/dropout.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {

namespace {

constexpr int kThreads = 256;

// Philox4x32-10 as td::philox4x32 (src/core/rng.cpp) computes it.
__device__ __forceinline__ uint4 philox4x32_10(uint64_t ctr, uint64_t subsequence, uint64_t seed) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32);
  uint32_t c2 = static_cast<uint32_t>(subsequence), c3 = static_cast<uint32_t>(subsequence >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return make_uint4(c0, c1, c2, c3);
}

// td::uint_to_uniform: 24 random bits scaled to [0, 1); exact in fp32.
__device__ __forceinline__ float uniform_of(uint32_t x) {
  return static_cast<float>(x >> 8) * 0x1.0p-24f;
}

template <typename T>
__device__ __forceinline__ T drop(T x, uint32_t bits, float p, float scale) {
  const bool keep = uniform_of(bits) >= p;
  return from_float<T>(keep ? __fmul_rn(to_float(x), scale) : 0.0f);
}

// One Philox block (four elements) per thread and loop step. kVec: in and out are aligned to
// four elements, so full blocks are loaded and stored as one vector.
template <typename T, bool kVec>
__global__ void dropout_kernel(const T* in, T* out, int64_t n, float p, float scale, uint64_t seed,
                               uint64_t offset, uint64_t subsequence) {
  const int64_t nblocks = ceil_div(n, 4);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nblocks;
       b += stride) {
    const uint4 r = philox4x32_10(offset + static_cast<uint64_t>(b), subsequence, seed);
    const uint32_t bits[4] = {r.x, r.y, r.z, r.w};
    const int64_t base = b * 4;
    if (kVec && base + 4 <= n) {
      Vec<T, 4> v = *reinterpret_cast<const Vec<T, 4>*>(in + base);
#pragma unroll
      for (int l = 0; l < 4; ++l) v.v[l] = drop(v.v[l], bits[l], p, scale);
      *reinterpret_cast<Vec<T, 4>*>(out + base) = v;
    } else {
      const int lanes = n - base < 4 ? static_cast<int>(n - base) : 4;
      for (int l = 0; l < lanes; ++l) out[base + l] = drop(in[base + l], bits[l], p, scale);
    }
  }
}

}  // namespace

template <typename T>
void dropout_forward(const T* in, T* out, int64_t n, float p, float scale, uint64_t seed,
                     uint64_t offset, uint64_t subsequence, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t nblocks = ceil_div(n, 4);
  const unsigned grid = grid_for(nblocks, kThreads);
  constexpr int kBytes = static_cast<int>(sizeof(T)) * 4;
  if (is_aligned<kBytes>(in) && is_aligned<kBytes>(out)) {
    dropout_kernel<T, true>
        <<<grid, kThreads, 0, stream>>>(in, out, n, p, scale, seed, offset, subsequence);
  } else {
    dropout_kernel<T, false>
        <<<grid, kThreads, 0, stream>>>(in, out, n, p, scale, seed, offset, subsequence);
  }
  TD_CUDA_LAUNCH_CHECK();
}

#define TD_DROPOUT_INSTANTIATE(T)                                                           \
  template void dropout_forward<T>(const T*, T*, int64_t, float, float, uint64_t, uint64_t, \
                                   uint64_t, cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_DROPOUT_INSTANTIATE)

}  // namespace td::kernels
