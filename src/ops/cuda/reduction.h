#pragma once
// CUDA side of the reductions of src/ops/reduction.cpp (internal; the front-end has checked the
// arguments, planned the reduction and allocated the outputs with the CPU's shapes and dtypes).
#include "ops/reduction_impl.h"
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// out <- scale * sum of x over p.dims (out: p.out, x's dtype for floating x, else int64).
void sum_into(const Tensor& x, const ops::ReducePlan& p, const Tensor& out, double scale);
// values (and indices, when given: int64) <- max or min of x over p.dims; p.count > 0.
void extremum_into(const Tensor& x, const ops::ReducePlan& p, const Tensor& values,
                   const Tensor* indices, bool is_max);
// out <- sum of squared deviations from the mean over p.dims / divisor; p.count > 0.
void var_into(const Tensor& x, const ops::ReducePlan& p, const Tensor& out, double divisor);
// out (0-dim, x's dtype) <- the 2-norm of all elements of x.
void norm_into(const Tensor& x, const Tensor& out);
// The [rows, n] gradient of max along a dim in the rows layout: g[i] at (i, idx[i]), 0 elsewhere.
Tensor max_backward_rows(const Tensor& g, const Tensor& idx, int64_t rows, int64_t n);

}  // namespace td::cuda_ops
