#pragma once
// Rotary position embedding (RoPE, Su et al.), the "rotate half" convention of GPT-NeoX/Llama:
// for pair (i, i + D/2) at position t, (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) with angle
// t * base^(-2i/D).
#include <utility>

#include "tardelli/core/tensor.h"

namespace td {

// cos and sin tables, fp32 [seq_len, head_dim/2].
std::pair<Tensor, Tensor> rope_cache(int64_t seq_len, int64_t head_dim, double base = 10000.0,
                                     int64_t start_pos = 0);
// x: [B, T, H, D] (any strides); cos/sin: [T, D/2]. Differentiable in x.
Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin);
// The kernel (inverse=true rotates by -angle: the backward).
Tensor rotary_kernel(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse);

}  // namespace td
