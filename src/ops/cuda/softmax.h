#pragma once
// CUDA side of softmax / log_softmax (src/ops/softmax.cpp); internal. Rows are the last dim of
// contiguous tensors (the front-end moves the reduced dim last).
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// softmax (log = false) or log_softmax of every row of x's last dim.
Tensor softmax_rows(const Tensor& x, bool log);
// The backward of softmax_rows from its output y and the gradient g (y's dtype and shape).
Tensor softmax_backward_rows(const Tensor& g, const Tensor& y, bool log);

}  // namespace td::cuda_ops
