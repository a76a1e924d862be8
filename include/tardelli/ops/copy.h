#pragma once
// Copies and conversions (any layout to any layout, any dtype to any dtype).
#include "tardelli/core/tensor.h"

namespace td {

// dst (any strides) <- src broadcast to dst's shape, converting dtype. Not recorded by autograd.
void copy_into(const Tensor& dst, const Tensor& src);
// Differentiable dtype conversion (gradient converted back to the input dtype).
Tensor to_dtype(const Tensor& t, DType dtype);
Tensor clone(const Tensor& t);  // differentiable, contiguous

}  // namespace td
