#pragma once
#include "tardelli/core/tensor.h"

namespace td {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);  // y = softmax(x)
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);  // y = log_softmax

}  // namespace td
