#pragma once
// Cache-blocked transposing copies on the CPU (internal header).
//
// Note [Transposed copies]: the generic strided copy (cpu::map) walks the destination in order,
// so when the source's unit-stride dim is not the destination's innermost dim every source load
// touches a new cache line: a [2048, 1024] fp32 transpose ran at ~2 GB/s against ~29 GB/s for a
// plain copy. transpose_copy recognises that pattern (after broadcasting, dst contiguous in its
// last dim, src unit-stride in another dim p) and copies it as a batch of 2-D transposes between
// dims p and last, in 8 x 8 tiles held in registers (AVX2 for 4-byte elements, scalar tiles for
// 1-, 2- and 8-byte ones), so both sides read and write whole cache lines.
#include "tardelli/core/tensor.h"

namespace td::cpu {

// dst <- src (same dtype, same shape, CPU) when the copy is a transposition as described above;
// returns false, having done nothing, otherwise (or when the tensor is too small to benefit).
bool transpose_copy(const Tensor& dst, const Tensor& src);

// dst[c * ldd + r] = src[r * lds + c] for r < R, c < C: one fp32 plane on the calling thread, in
// the same 8 x 8 register tiles (scalar at the edges), for kernels that transpose small tiles
// inside their own parallel loops (the CPU attention's key and value blocks).
void transpose_plane(int64_t R, int64_t C, const float* src, int64_t lds, float* dst, int64_t ldd);

}  // namespace td::cpu
