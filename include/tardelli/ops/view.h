#pragma once
// Views: new sizes/strides/offset over the same storage, no copy. All are differentiable.
// Tensor's view methods (t.view(...), t.transpose(...)) call these.
#include <optional>

#include "tardelli/core/tensor.h"

namespace td {

// `shape` may contain one -1. view requires a compatible layout; reshape copies if needed.
Tensor view(const Tensor& t, const Shape& shape);
Tensor reshape(const Tensor& t, const Shape& shape);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor permute(const Tensor& t, const Shape& dims);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor expand(const Tensor& t, const Shape& shape);  // -1 keeps a size
Tensor squeeze(const Tensor& t, std::optional<int64_t> dim = std::nullopt);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor contiguous(const Tensor& t);
// Not differentiable: raw strided view for kernels and tests.
Tensor as_strided(const Tensor& t, const Shape& sizes, const Shape& strides, int64_t offset);

// Resolves one -1 in `shape` against numel; errors name `op` and both shapes.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op);

}  // namespace td
