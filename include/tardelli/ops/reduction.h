#pragma once
// Reductions over dims (deterministic: a fixed summation order independent of thread count;
// fp32 accumulation for bf16/f16). An empty `dims` means all dims.
#include <optional>
#include <utility>

#include "tardelli/core/tensor.h"

namespace td {

Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
// Max over all elements (0-dim result). Gradient is split evenly between tied maxima.
Tensor max(const Tensor& x);
Tensor min(const Tensor& x);
// Max along one dim: values (differentiable, gradient to the index) and int64 indices (the
// first maximum on ties).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor amax(const Tensor& x, const Shape& dims, bool keepdim = false);
// Logical reductions, as torch.all / torch.any: a bool tensor, true where every (any) element
// over `dims` (all dims when empty) is non-zero. all() of nothing is true, any() false.
Tensor all(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
// Variance (Bessel-corrected unless correction=0), differentiable.
Tensor var(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
// The 2-norm of all elements, fp32 accumulation (for gradient clipping).
Tensor norm(const Tensor& x);

}  // namespace td
