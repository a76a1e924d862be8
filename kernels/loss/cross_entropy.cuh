#pragma once
// Fused cross entropy over contiguous [rows, C] logits with int64 targets (Note [Fused cross
// entropy] in src/ops/loss.cpp is the specification). The softmax is never stored.
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

// Per row: shift = max (0 for an all -inf row), log_s = log(sum exp(x - shift)) and the loss
// (label smoothing eps; 0 for ignored rows, NaN for an out-of-range target).
template <typename T>
void cross_entropy_forward(const T* logits, const int64_t* target, int64_t rows, int64_t C,
                           int64_t ignore_index, float eps, float* loss, float* shift, float* log_s,
                           cudaStream_t stream);

// What cross_entropy_reduce finds (device memory, written by one block).
struct CrossEntropyTotals {
  double total;          // sum of the per-row losses of valid rows
  long long count;       // rows whose target is neither ignore_index nor out of range
  long long bad_row;     // first row with an out-of-range target, or -1
  long long bad_target;  // its target
};

// Fills *totals and, when out is not null, writes out[0] = total (Sum) or total / count (Mean,
// NaN when every row is ignored) rounded to T. Deterministic (fixed order).
template <typename T>
void cross_entropy_reduce(const float* loss, const int64_t* target, int64_t rows, int64_t C,
                          int64_t ignore_index, bool mean, T* out, CrossEntropyTotals* totals,
                          cudaStream_t stream);

// dx[r, c] = (softmax[r, c] - (1 - eps) [c == t_r] - eps / C) * g_r, zero rows for ignored
// targets, with g_r = float(double(g[g_scalar ? 0 : r]) * scale) and softmax = exp((x - shift)
// - log_s) from the forward's statistics.
template <typename T>
void cross_entropy_backward(const T* logits, const int64_t* target, const float* shift,
                            const float* log_s, const float* g, bool g_scalar, double scale,
                            int64_t rows, int64_t C, int64_t ignore_index, float eps, T* dx,
                            cudaStream_t stream);

}  // namespace td::kernels
