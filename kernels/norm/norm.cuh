#pragma once
// layer_norm / rms_norm forward and backward over contiguous [rows, n] (Note [Fused norms] in
// src/ops/norm.cpp is the specification). Statistics are fp32; weight and bias are fp32 [n].
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace td::kernels {

// y = (x - mean) * rstd * w + b per row (layer: mean and centred variance; rms: mean = 0).
// mean (layer only) and rstd are written as fp32 [rows]; w and b may be null.
template <typename T>
void norm_forward(const T* x, T* y, float* mean, float* rstd, const float* w, const float* b,
                  int64_t rows, int64_t n, float eps, bool layer, cudaStream_t stream);

// Bytes of device scratch norm_backward needs (0 when neither dw nor db is wanted).
size_t norm_backward_scratch_bytes(int64_t rows, int64_t n, bool want_dw, bool want_db);

// dx for every row and, when dw / db are given, the fp32 column sums dw = sum_r g * xhat and
// db = sum_r g (deterministic: fixed row chunks, chunk partials summed in order). mean is null
// for rms_norm; w may be null. `scratch` holds norm_backward_scratch_bytes(...) bytes.
template <typename T>
void norm_backward(const T* g, const T* x, const float* mean, const float* rstd, const float* w,
                   T* dx, float* dw, float* db, int64_t rows, int64_t n, void* scratch,
                   cudaStream_t stream);

}  // namespace td::kernels
