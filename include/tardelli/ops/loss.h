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

// The summed cross-entropy of fp32 logits [N, C] against target [N] (rows equal to
// ignore_index contribute nothing), returned as a double, with `logits` overwritten by the
// gradient of that sum: softmax - onehot per row, zeros on ignored rows. One exp per element and
// no second [N, C] buffer (the chunked LM head's kernel). Not recorded by autograd.
double cross_entropy_sum_and_grad_(const Tensor& logits, const Tensor& target,
                                   int64_t ignore_index = -100);
// The same with the sum left on the logits' device, a 0-dim float32 tensor: on CUDA nothing is
// read back (an out-of-range target is reported at the next read of device memory to the host:
// Note [Deferred device checks] in kernels/runtime/deferred_checks.cuh). On the CPU it is
// cross_entropy_sum_and_grad_'s value rounded to float32.
Tensor cross_entropy_sum_and_grad_on_device_(const Tensor& logits, const Tensor& target,
                                             int64_t ignore_index = -100);

// The final projection fused with the loss: mean cross_entropy(x @ weight^T, target) for x
// [N, d], weight [V, d], target [N]. Rows are processed in chunks of at most `chunk_elems`
// logits, so the [N, V] logits and their gradient are never held whole. When a gradient is
// needed the forward pass also forms d x and d weight chunk by chunk (softmax - onehot times
// the chunk's operands) and keeps only those ([N, d] and fp32 [V, d]) for backward (Note
// [Chunked LM head]). Logits are taken to fp32 before the softmax. chunk_elems 0 picks it by
// device (kLinearCrossEntropyChunkCpu / Cuda).
inline constexpr int64_t kLinearCrossEntropyChunkCpu = int64_t{1} << 22;
inline constexpr int64_t kLinearCrossEntropyChunkCuda = int64_t{1} << 27;
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& target,
                            int64_t ignore_index = -100, int64_t chunk_elems = 0);

}  // namespace td
