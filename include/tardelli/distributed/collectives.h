#pragma once
// Autograd collectives: the communication steps of tensor, sequence and context parallelism as
// differentiable functions whose backward is the dual collective (Megatron-core's
// tensor_parallel/mappings.py). Parallel layers are built only from these.
//
//   function                      forward                          backward
//   copy_to_region                identity                         all_reduce
//   reduce_from_region            all_reduce                       identity
//   scatter_to_region(dim=-1)     keep own chunk along dim         all_gather along dim
//   gather_from_region(dim=-1)    all_gather along dim             keep own chunk along dim
//   reduce_scatter_to_sequence(0) reduce_scatter along dim         all_gather along dim
//   gather_from_sequence(0)       all_gather along dim             reduce_scatter along dim
//                                                                  (or keep own chunk when
//                                                                  tp_output_grad is false)
//
// Contract: every rank of `comm` calls the same functions in the same order with the same
// shapes, dtypes and requires_grad, so the backward collectives line up as well (the autograd
// engine visits the same graph in the same order on each rank). Chunks are equal: the split
// dim's size (or, for gathers, each rank's size) must be divisible as stated. Rank i owns chunk
// i. A group of size 1 makes every function the identity. Double backward is not supported.
//
// Note [Gathers along an inner dim]: the communicator's collectives are flat (rank i's data at
// [i * n, (i + 1) * n)); gathering along dim d > 0 receives [size, ...shape] and moves the
// rank axis next to d with one copy, and reduce-scatter along d does the inverse before sending.
#include <cstdint>
#include <vector>

#include "tardelli/core/tensor.h"
#include "tardelli/distributed/communicator.h"

namespace td::distributed {

Tensor copy_to_region(const Tensor& x, const CommPtr& comm);
Tensor reduce_from_region(const Tensor& x, const CommPtr& comm);
// x.size(dim) must be divisible by comm->size().
Tensor scatter_to_region(const Tensor& x, const CommPtr& comm, int64_t dim = -1);
Tensor gather_from_region(const Tensor& x, const CommPtr& comm, int64_t dim = -1);
// x.size(dim) must be divisible by comm->size().
Tensor reduce_scatter_to_sequence(const Tensor& x, const CommPtr& comm, int64_t dim = 0);
// tp_output_grad = false is Megatron's tensor_parallel_output_grad=False: the consumer of the
// gathered tensor is replicated, so each rank's gradient is already the full one and backward
// only keeps its own chunk.
Tensor gather_from_sequence(const Tensor& x, const CommPtr& comm, int64_t dim = 0,
                            bool tp_output_grad = true);

// Note [Row all-to-all]: expert parallelism's exchange. x [R, ...] holds, back to back in rank
// order, send_rows[j] rows for rank j (sum = R); the result holds recv_rows[j] rows from each
// rank j, back to back in rank order. recv_rows must be what the peers send (exchange the counts
// first: exchange_counts). Backward sends the gradient rows back the same way (the roles of the
// counts swapped). A group of size 1 is the identity.
Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows, const CommPtr& comm);
// Every rank's `mine` (the same length everywhere): row j of the result is rank j's vector.
// (All-gather of int64 counts, no autograd.)
std::vector<std::vector<int64_t>> exchange_counts(const std::vector<int64_t>& mine,
                                                  const CommPtr& comm);

// The same collectives without autograd, on detached copies (never in place on `x`): the
// building blocks above, usable directly on gradients or buffers.
Tensor all_reduce_copy(const Tensor& x, const CommPtr& comm, ReduceOp op = ReduceOp::Sum);
Tensor all_gather_along(const Tensor& x, const CommPtr& comm, int64_t dim);
Tensor reduce_scatter_along(const Tensor& x, const CommPtr& comm, int64_t dim,
                            ReduceOp op = ReduceOp::Sum);
// This rank's chunk along dim (a contiguous copy).
Tensor chunk_along(const Tensor& x, const CommPtr& comm, int64_t dim);

// Note [Norm exchange]: the sum of one double over the ranks of `comm`, the same bits on every
// rank. There is no float64 dtype to all_reduce and an fp32 sum would lose digits, so each
// rank's double is all-gathered bit for bit (as int64) and the values are added in rank order.
// (Gradient norms of model- and data-parallel optimizers.)
double sum_over_ranks(double local, const CommPtr& comm);

}  // namespace td::distributed
