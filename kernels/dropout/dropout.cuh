#pragma once
// Dropout with the CPU backend's Philox stream (src/ops/dropout.cpp, core/rng.h).
//
// Note [CUDA dropout mask]: element i of the draw uses Philox4x32-10 block (offset + i/4,
// subsequence) keyed by seed, lane i % 4, turned into a uniform in [0, 1) as (bits >> 8) * 2^-24
// and kept iff uniform >= p (p compared in fp32). Each thread computes one Philox block and the
// four elements it covers, so the mask is a function of the state and i alone: bitwise the
// CPU's. Kept values are v * scale in fp32 (one rounding, like the CPU), dropped ones are 0.
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

// out[i] = keep_i ? in[i] * scale : 0 for i in [0, n); in and out contiguous (may alias).
template <typename T>
void dropout_forward(const T* in, T* out, int64_t n, float p, float scale, uint64_t seed,
                     uint64_t offset, uint64_t subsequence, cudaStream_t stream);

}  // namespace td::kernels
