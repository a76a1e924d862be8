#pragma once
// Rotary position embedding, "rotate half" layout (src/ops/rotary.cpp is the specification):
// x is [B, S, H, D] with any strides, cos/sin are contiguous fp32 [S, D/2], the output is
// contiguous [B, S, H, D]; pair (i, i + D/2) of row (b, t, h) is rotated by the angle of (t, i),
// or by minus that angle when `inverse` (the backward). One thread per pair, fp32 math.
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

struct RotaryShape {
  int64_t batch, seq, heads, head_dim;
  int64_t stride[4];  // of x, in elements
};

template <typename T>
void rotary_forward(const T* x, const RotaryShape& shape, const float* cos, const float* sin,
                    bool inverse, T* out, cudaStream_t stream);

}  // namespace td::kernels
