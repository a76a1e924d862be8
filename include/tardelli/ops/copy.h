#pragma once
// Copies and conversions (any layout to any layout, any dtype to any dtype, float8 included).
#include "tardelli/core/tensor.h"

namespace td {

// dst (any strides) <- src broadcast to dst's shape, converting dtype; dst and src may be on
// different devices (the call returns when the copy is complete). Not recorded by autograd.
void copy_into(const Tensor& dst, const Tensor& src);
// Differentiable dtype conversion (gradient converted back to the input dtype). To a float8
// dtype it rounds to nearest even without saturation (Note [FP8 storage types] in core/fp8.h)
// and is not recorded by autograd (Note [FP8 dtypes] in core/dtype.h).
Tensor to_dtype(const Tensor& t, DType dtype);
// t converted to the float8 `dtype`, rounding to nearest even; with saturate, values beyond the
// format's range become +-max (448 for e4m3fn, 57344 for e5m2; infinities too), without it the
// result is to_dtype's (NaN for e4m3fn, +-inf for e5m2). NaN stays NaN. Not recorded by
// autograd. t may have any non-float8 dtype (or already be `dtype`: returned as is).
Tensor to_fp8(const Tensor& t, DType dtype, bool saturate = true);
// Differentiable move to another device (gradient moved back); t itself when already there.
Tensor to_device(const Tensor& t, Device device);
Tensor clone(const Tensor& t);  // differentiable, contiguous
// A host copy of `t` for a background writer (asynchronous checkpoints): a CPU tensor's clone;
// for a CUDA tensor a page-locked host tensor filled on the device's snapshot stream without
// blocking (Note [Host snapshot] in core/cuda_runtime.h): call wait_host_snapshot(t.device())
// before reading it. Not recorded by autograd.
Tensor host_snapshot(const Tensor& t);
void wait_host_snapshot(Device device);

}  // namespace td
