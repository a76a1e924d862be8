#pragma once
#include <optional>

// Tensor-parallel linear layers (Megatron-core's ColumnParallelLinear / RowParallelLinear,
// tensor_parallel/layers.py) as functions of tensors and the tensor-parallel group `tp`. They
// hold no state: the caller owns the weight shards (leaf tensors) and passes the group.
//
// Layout: x is [..., in]. Under sequence parallelism dim `seq_dim` (default 0: Megatron's
// [s, b, h]; the GPT's [b, s, h] passes 1) is split over the tp ranks (rank i holds positions
// [i*n, (i+1)*n) of it), so that dim of the full tensor must be divisible by tp->size().
//
// Column-parallel: W [out, in] is split by rows (output features); rank i holds rows
// [i*out/tp, (i+1)*out/tp) and the matching bias slice. Each rank computes its own output
// columns from the whole input: y_i = x W_i^T + b_i.
// Row-parallel: W [out, in] is split by columns (input features); rank i holds columns
// [i*in/tp, (i+1)*in/tp) and consumes the matching slice of the input's last dim. The partial
// products are summed over the group, then the full (replicated) bias is added once.
//
// Column then row (an MLP: fc1 column-parallel without gather_output, an elementwise function,
// fc2 row-parallel with input_is_parallel) communicates once in forward (the all-reduce, or the
// reduce-scatter under sequence parallelism) and once in backward.
//
// Contract: every rank of `tp` calls these with the same shapes and flags in the same order
// (collectives.h). Gradients are the gradients of the logical (unsplit) model: for replicated
// inputs/parameters, every rank receives the full gradient.
#include <cstdint>
#include <functional>

#include "tardelli/core/tensor.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/ops/activation_linear.h"

namespace td::parallel {

using distributed::CommPtr;

// The GEMM a layer runs on this rank's operands, y = x w^T + b (empty: td::linear). The GPT
// passes its per-linear precision here (an emulated FP8 GEMM, bf16 or fp32 operands: Note
// [Linear precision] in models/gpt.h); the collectives around it do not change.
using LocalLinear = std::function<Tensor(const Tensor& x, const Tensor& w, const Tensor& b)>;

// y[..., out/tp] (or [..., out] with gather_output) = copy_to_region(x) W_shard^T + b_shard.
// w_shard [out/tp, in]; b_shard [out/tp] or undefined. With sequence_parallel, x is this rank's
// chunk of dim seq_dim and is all-gathered along it first (backward: reduce-scatter of its
// gradient). gather_output together with sequence_parallel is an error (as in Megatron).
Tensor column_parallel_linear(const Tensor& x, const Tensor& w_shard, const Tensor& b_shard,
                              const CommPtr& tp, bool gather_output = false,
                              bool sequence_parallel = false, int64_t seq_dim = 0,
                              const LocalLinear& gemm = {});

// y[..., out] = reduce(x_shard W_shard^T) + bias. w_shard [out, in/tp]; bias [out] (full,
// replicated) or undefined. input_is_parallel: x is already this rank's [..., in/tp] slice (the
// output of a column-parallel layer); otherwise x is the full [..., in] and is split along its
// last dim (backward: all-gather). The reduction is reduce_from_region (all-reduce), or under
// sequence_parallel reduce_scatter_to_sequence along seq_dim (the result is this rank's chunk;
// requires input_is_parallel). The bias is added after the reduction; under sequence_parallel each
// rank adds it to its own rows only, so it enters through copy_to_region and its gradient is
// all-reduced over tp (the full bias gradient on every rank).
// With `act`, the layer's input is act(x) of this rank's x (input_is_parallel; an MLP's
// activation on its column-parallel output), recomputed in backward (activation_linear); with
// a `gemm` act(x) is computed first and kept, and gemm(act(x), w_shard, undefined) gives the
// partial product.
Tensor row_parallel_linear(const Tensor& x, const Tensor& w_shard, const Tensor& bias,
                           const CommPtr& tp, bool input_is_parallel = true,
                           bool sequence_parallel = false, int64_t seq_dim = 0,
                           std::optional<MlpActivation> act = std::nullopt,
                           const LocalLinear& gemm = {});

// Note [Layout-independent init]: a model initialized from a seed draws the FULL weight and
// every rank slices its shard, so the same seed gives the same logical model for every tp
// degree (and a tp=1 checkpoint can be resharded). These return a contiguous, detached copy.
// shard_rows: rows [rank*n/size, (rank+1)*n/size) of a [n, ...] tensor (column-parallel W, b).
// shard_cols: columns [rank*m/size, ...) of a [n, m] tensor (row-parallel W).
// td::Error unless 0 <= rank < size and the dim is divisible by size.
Tensor shard_rows(const Tensor& full, int rank, int size);
Tensor shard_cols(const Tensor& full, int rank, int size);

}  // namespace td::parallel
