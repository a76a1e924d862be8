#pragma once
#include "tardelli/core/tensor.h"

namespace td {

// out[..., :] = weight[indices[...], :]; indices int32/int64, out-of-range is a td::Error.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Deterministic scatter-add of grad rows into a [num_embeddings, dim] zero tensor (fp32
// accumulation, rows summed in index order regardless of thread count).
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings);

}  // namespace td
