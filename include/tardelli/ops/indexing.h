#pragma once
#include "tardelli/core/tensor.h"

namespace td {

// x with `value` where mask (bool, broadcastable to x) is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// cond ? a : b, broadcasting all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Lower / upper triangle of the last two dims (diagonal k as in torch).
Tensor tril(const Tensor& x, int64_t k = 0);
Tensor triu(const Tensor& x, int64_t k = 0);
// Rows of x along `dim` picked by a 1-D int index; backward is a deterministic index_add.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// x with src's slices added at `index` along dim (torch's x.index_add(dim, index, src)): a new
// tensor, x unchanged; repeated indices accumulate.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace td
