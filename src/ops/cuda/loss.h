#pragma once
// CUDA side of cross_entropy (src/ops/loss.cpp); internal.
#include "tardelli/ops/loss.h"

namespace td::cuda_ops {

// The forward of cross_entropy over contiguous [rows, C] logits and a target of `batch` shape
// (int32 or int64, on the logits' device). Returns the loss as the CPU does (None: `batch` in
// the logits' dtype; Mean / Sum: a 0-dim tensor in the logits' dtype, on the device) and fills
// what the backward needs: the target as int64 [rows], the fp32 per-row shift and log_s, and
// the number of rows not ignored. An out-of-range target raises the CPU's td::Error (this
// waits for the device). With `deferred`, nothing is read back: count is left at -1 and an
// out-of-range target is reported at the next read to the host (Note [Deferred device checks];
// its row's loss is NaN and its gradient zero meanwhile).
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                             Reduction reduction, double label_smoothing, const Shape& batch,
                             Tensor& target64, Tensor& shift, Tensor& log_s, int64_t& count,
                             bool deferred = false);

// d loss / d logits in the shape `logits_shape` (logits' dtype) from the forward's statistics.
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target64,
                              const Tensor& shift, const Tensor& log_s, int64_t count,
                              int64_t ignore_index, Reduction reduction, double label_smoothing,
                              const Shape& logits_shape);

}  // namespace td::cuda_ops
