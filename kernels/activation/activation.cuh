#pragma once
// Elementwise activations, forward and backward (Note [Activation numerics] in
// src/ops/activation.cpp is the specification), over contiguous arrays of n elements.
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

enum class ActivationOp : int { GeluErf = 0, GeluTanh = 1, Silu = 2, Relu = 3 };

// y[i] = f(x[i]).
template <typename T>
void activation_forward(ActivationOp op, const T* x, T* y, int64_t n, cudaStream_t stream);

// dx[i] = g[i] * f'(x[i]); for Relu `x` is the forward's output y (as relu_backward takes it).
template <typename T>
void activation_backward(ActivationOp op, const T* g, const T* x, T* dx, int64_t n,
                         cudaStream_t stream);

}  // namespace td::kernels
