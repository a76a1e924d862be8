#pragma once
// softmax / log_softmax forward and backward over the rows of contiguous [rows, n] tensors
// (the reduced dim last; src/ops/softmax.cpp moves any other dim there first).
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

// y[r, :] = softmax(x[r, :]) or log_softmax(x[r, :]) (fp32 math; all -inf rows give NaN).
template <typename T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t n, bool log, cudaStream_t stream);

// dx = y * (g - sum(g * y)) (softmax) or g - exp(y) * sum(g) (log_softmax; y = log_softmax).
template <typename T>
void softmax_backward(const T* g, const T* y, T* dx, int64_t rows, int64_t n, bool log,
                      cudaStream_t stream);

}  // namespace td::kernels
