#pragma once
// Vocabulary-parallel embedding and cross-entropy (Megatron-core's VocabParallelEmbedding,
// tensor_parallel/layers.py, and vocab_parallel_cross_entropy, tensor_parallel/cross_entropy.py).
//
// The vocabulary is padded to V_pad = padded_vocab_size(V, tp) and split into tp equal ranges:
// rank i owns token ids [i*V_pad/tp, (i+1)*V_pad/tp). The embedding table [V_pad, h] (tied with
// the output projection in a GPT) is split by rows the same way, so the output projection
// produces this rank's logit columns [tokens, V_pad/tp] and the loss is computed without ever
// gathering the full [tokens, V_pad] logits. Ids >= V (the padding) are never valid targets, and
// their logit columns are masked to -inf in the loss, so the padding never changes the loss.
#include <cstdint>

#include "tardelli/core/tensor.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/ops/loss.h"

namespace td::parallel {

using distributed::CommPtr;

// The smallest multiple of multiple * tp that is >= vocab_size (Megatron's
// --make-vocab-size-divisible-by, default 128, times the tp size). td::Error unless all > 0.
int64_t padded_vocab_size(int64_t vocab_size, int tp_size, int64_t multiple = 128);

// The vocabulary range [start, end) that rank `rank` of `size` owns of a padded vocabulary.
struct VocabRange {
  int64_t start = 0;
  int64_t end = 0;
  int64_t size() const { return end - start; }
};
VocabRange vocab_range(int64_t padded_vocab, int rank, int size);

// This rank's rows of a full [V, h] table (V <= padded_vocab) padded with zero rows to
// [padded_vocab, h]: a contiguous, detached [padded_vocab/size, h] copy (Note [Layout-
// independent init] in tensor_parallel.h).
Tensor shard_vocab_rows(const Tensor& full, int64_t padded_vocab, int rank, int size);

// out[..., h] = W[ids[...]]: each rank looks up the ids in its range [vocab_start, vocab_start +
// w_shard.size(0)), writes zero rows for the others, and the partial results are summed over tp
// (reduce_from_region; under sequence_parallel reduce_scatter_to_sequence along seq_dim, so the
// result is this rank's chunk of that dim of ids, which must be divisible by tp). ids (int32/int64)
// are replicated over tp; an id outside [0, w_shard.size(0) * tp) is a td::Error.
Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& w_shard, const CommPtr& tp,
                                int64_t vocab_start, bool sequence_parallel = false,
                                int64_t seq_dim = 0);

// Cross-entropy of logits split over the vocabulary: logits_shard [N, V_pad/tp] holds columns
// [vocab_start, vocab_start + V_pad/tp) of the logits, targets [N] (int32/int64, replicated
// over tp) hold ids in [0, true_vocab_size) or ignore_index. Three reductions over tp, no
// gather: the row max (all-reduce max), then the sum of exp(x - max) and the target's logit
// (one all-reduce sum of both). Columns with id >= true_vocab_size count as -inf.
// reduction: None gives per-token losses [N] (0 for ignored tokens); Mean (the GPT's loss)
// averages over the tokens that are not ignored (all ignored: 0/0 = NaN, like td::cross_entropy);
// Sum adds them. The result has the logits' dtype (computed in fp32) and is identical on every
// rank. Backward is fused: d logits_shard = scale * (softmax - onehot) on the local columns
// only (0 on padded columns and ignored rows), recomputed from the saved row max and sum. On
// the CPU host loops do this; on a GPU the steps run as tensor ops on the device (Note
// [Vocab-parallel head on a device]), which form softmax - onehot in the forward and keep it
// for backward in place of the logits. `tensor_ops` (testing aid): that path on CPU tensors.
Tensor vocab_parallel_cross_entropy(const Tensor& logits_shard, const Tensor& targets,
                                    const CommPtr& tp, int64_t vocab_start, int64_t true_vocab_size,
                                    int64_t ignore_index = -100,
                                    Reduction reduction = Reduction::Mean, bool tensor_ops = false);

// The head and the loss fused and chunked over tokens (the tensor-parallel counterpart of
// td::linear_cross_entropy, Note [Chunked LM head]): the mean vocab-parallel cross-entropy of
// logits = h w_shard^T for h [N, d] (the same on every tp rank), w_shard [V_pad/tp, d] (columns
// [vocab_start, ...) of the padded vocabulary), targets [N]. Rows go in chunks of at most
// chunk_elems local logits, and the [N, V_pad/tp] logits are never held whole: when a gradient
// is needed the forward also forms d h and d w_shard chunk by chunk (all reductions over tp
// happen in the forward) and keeps only those for backward. d h is this rank's partial sum over its
// vocabulary columns: wrap h in copy_to_region (or gather_from_sequence) so that backward
// completes it over tp. Returns an fp32 scalar, identical on every rank (all rows ignored: NaN).
// On the CPU each chunk's softmax runs in host loops and its gradient is formed in place over the
// logits; on a GPU (Note [Vocab-parallel head on a device]) the same steps run as tensor ops on
// the device, the rows' max, sum and target logit crossing to the host for the reductions over
// tp. `tensor_ops` (testing aid): take the device path on CPU tensors.
Tensor vocab_parallel_linear_cross_entropy(const Tensor& h, const Tensor& w_shard,
                                           const Tensor& targets, const CommPtr& tp,
                                           int64_t vocab_start, int64_t true_vocab_size,
                                           int64_t ignore_index = -100,
                                           int64_t chunk_elems = int64_t{1} << 22,
                                           bool tensor_ops = false);

}  // namespace td::parallel
