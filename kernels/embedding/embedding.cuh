#pragma once
// The deterministic backward of the embedding lookup (src/ops/embedding.cpp is the specification).
//
// Note [CUDA embedding backward]: the CPU backend buckets positions by vocab row with a stable
// counting sort and sums each row's gradient rows in position order in fp32. Here the
// (index, position) pairs are sorted with CUB's radix sort (stable, so positions stay in
// increasing order within an index), each vocab row finds its segment by binary search, and one
// block per vocab row sums the segment's gradient rows in order, fp32, one thread per column.
// Every output element is written once by one thread, in the same order as on the CPU, so the
// result equals the CPU's bit for bit and does not depend on timing. Rows no index names are
// written as zeros.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace td::kernels {

// The forward lookup and the index validation are index_select along dim 0 and
// mark_bad_index (kernels/indexing/indexing.cuh): the same row gather and the same check,
// reported by a deferred check (Note [Deferred device checks]).

// Device scratch (bytes) that embedding_backward needs for n indices and num_embeddings rows.
template <typename IndexT>
size_t embedding_backward_scratch_bytes(int64_t n, int64_t num_embeddings);

// grad_weight[v, :] = sum over positions i with indices[i] == v, in increasing i, of
// grad[i, :] (fp32 accumulation, rounded once to T). grad is [n, dim] contiguous, grad_weight
// [num_embeddings, dim] contiguous; every row of grad_weight is written. `scratch` holds
// embedding_backward_scratch_bytes(n, num_embeddings) bytes, 256-byte aligned. The gradient rows
// of indices outside [0, num_embeddings) are dropped (the caller reports those indices).
template <typename T, typename IndexT>
void embedding_backward(const T* grad, const IndexT* indices, T* grad_weight, int64_t n,
                        int64_t num_embeddings, int64_t dim, void* scratch, size_t scratch_bytes,
                        cudaStream_t stream);

}  // namespace td::kernels
