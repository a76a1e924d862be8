#pragma once
// Joining and splitting along a dim.
#include "tardelli/core/tensor.h"

namespace td {

Tensor cat(const TensorList& tensors, int64_t dim = 0);
Tensor stack(const TensorList& tensors, int64_t dim = 0);
// Views of consecutive pieces of `split_size` (the last may be smaller), like torch.split.
TensorList split(const Tensor& x, int64_t split_size, int64_t dim = 0);
TensorList split(const Tensor& x, const Shape& sizes, int64_t dim = 0);
TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace td
