#pragma once
#include "tardelli/core/tensor.h"

namespace td {

enum class Reduction { None, Mean, Sum };

// Fused log_softmax + negative log likelihood over the last dim of `logits` ([..., C]) for
// int64/int32 `target` ([...]). Rows whose target is ignore_index contribute nothing; Mean
// divides by the number of rows not ignored. The softmax is never stored: backward recomputes
// it from the per-row logsumexp.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::Mean, double label_smoothing = 0.0);

}  // namespace td
