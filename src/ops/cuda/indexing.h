#pragma once
// CUDA side of index_select / index_add (src/ops/indexing.cpp); internal. The front-end has
// checked x (and src: same device and dtype as x) and wrapped dim; these check the index
// (defined, on x's device, 1-D, int32/int64, every value in range: a td::Error naming the op and
// the bad index) with the CPU backend's messages.
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// A new tensor: x with src's rows added at the index (deterministic, matches the CPU bitwise).
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace td::cuda_ops
