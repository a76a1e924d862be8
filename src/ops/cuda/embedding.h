#pragma once
// CUDA side of embedding and embedding_backward (src/ops/embedding.cpp); internal.
#include <cstdint>

#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// The lookup (no autograd): weight [V, D] on a CUDA device, indices int32/int64 on the same
// device, already checked by the front-end for rank and dtype. Indices are validated on the
// device (one small copy back to the host); an out-of-range index is a td::Error naming it.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Deterministic scatter-add (Note [CUDA embedding backward]); grad's shape already checked.
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings);

}  // namespace td::cuda_ops
