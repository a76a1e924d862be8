#include "tardelli/parallel/tensor_parallel.h"

#include "ops/common.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/matmul.h"

namespace td::parallel {

namespace dist = td::distributed;

namespace {

void check_group(const CommPtr& tp, const char* op) {
  TD_CHECK(tp != nullptr, op, ": the tensor-parallel communicator is null");
}

// Sequence parallelism splits dim `seq_dim` (the collectives check its divisibility by tp); it
// must not be the feature dim.
void check_seq_dim(const Tensor& x, int64_t seq_dim, const char* op) {
  TD_CHECK(x.dim() >= 2 && seq_dim >= 0 && seq_dim < x.dim() - 1, op,
           ": sequence parallelism splits dim ", seq_dim, ", which must be a non-feature dim of ",
           describe(x));
}

Tensor shard_dim(const Tensor& full, int64_t dim, int rank, int size, const char* op) {
  ops::check_defined(full, op, "full");
  TD_CHECK(size >= 1 && rank >= 0 && rank < size, op, ": rank ", rank, " is not in [0, ", size,
           ")");
  TD_CHECK(full.dim() > dim, op, ": expected at least ", dim + 1, " dims, got ", describe(full));
  TD_CHECK(full.size(dim) % size == 0, op, ": size ", full.size(dim), " of dim ", dim, " of ",
           describe(full), " is not divisible by ", size);
  const int64_t k = full.size(dim) / size;
  return full.detach().narrow(dim, rank * k, k).clone();
}

}  // namespace

Tensor column_parallel_linear(const Tensor& x, const Tensor& w_shard, const Tensor& b_shard,
                              const CommPtr& tp, bool gather_output, bool sequence_parallel,
                              int64_t seq_dim, const LocalLinear& gemm) {
  const char* op = "column_parallel_linear";
  ops::check_defined(x, op, "x");
  ops::check_defined(w_shard, op, "w_shard");
  check_group(tp, op);
  TD_CHECK(w_shard.dim() == 2, op, ": w_shard must be 2-D [out/tp, in], got ", describe(w_shard));
  TD_CHECK(x.dim() >= 1 && x.size(-1) == w_shard.size(1), op, ": input ", describe(x),
           " does not match w_shard ", describe(w_shard), " (last dim must be ", w_shard.size(1),
           ")");
  TD_CHECK(!b_shard.defined() || (b_shard.dim() == 1 && b_shard.size(0) == w_shard.size(0)), op,
           ": b_shard ", b_shard.defined() ? describe(b_shard) : std::string("-"), " must be [",
           w_shard.size(0), "] to match w_shard ", describe(w_shard));
  TD_CHECK(!(gather_output && sequence_parallel), op,
           ": gather_output and sequence_parallel cannot be combined (the output of a "
           "sequence-parallel column layer stays split along its last dim)");
  Tensor input;
  if (sequence_parallel) {
    check_seq_dim(x, seq_dim, op);
    input = dist::gather_from_sequence(x, tp, seq_dim, /*tp_output_grad=*/true);
  } else {
    input = dist::copy_to_region(x, tp);
  }
  Tensor y = gemm ? gemm(input, w_shard, b_shard) : linear(input, w_shard, b_shard);
  return gather_output ? dist::gather_from_region(y, tp, -1) : y;
}

Tensor row_parallel_linear(const Tensor& x, const Tensor& w_shard, const Tensor& bias,
                           const CommPtr& tp, bool input_is_parallel, bool sequence_parallel,
                           int64_t seq_dim, std::optional<MlpActivation> act,
                           const LocalLinear& gemm) {
  const char* op = "row_parallel_linear";
  ops::check_defined(x, op, "x");
  ops::check_defined(w_shard, op, "w_shard");
  check_group(tp, op);
  TD_CHECK(w_shard.dim() == 2, op, ": w_shard must be 2-D [out, in/tp], got ", describe(w_shard));
  TD_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w_shard.size(0)), op, ": bias ",
           bias.defined() ? describe(bias) : std::string("-"), " must be [", w_shard.size(0),
           "] to match w_shard ", describe(w_shard));
  TD_CHECK(!(sequence_parallel && !input_is_parallel), op,
           ": sequence_parallel requires input_is_parallel (as in Megatron)");
  TD_CHECK(x.dim() >= 1, op, ": expected an input [..., in], got ", describe(x));
  TD_CHECK(!act || input_is_parallel, op,
           ": an input activation needs input_is_parallel (it applies to this rank's slice)");
  const int64_t act_in = act == MlpActivation::SwiGLU ? 2 * w_shard.size(1) : w_shard.size(1);
  const int64_t want_in = input_is_parallel ? act_in : w_shard.size(1) * tp->size();
  TD_CHECK(x.size(-1) == want_in, op, ": input ", describe(x), " does not match w_shard ",
           describe(w_shard), " (last dim must be ", want_in,
           input_is_parallel ? ", this rank's slice)" : ", the full input)");
  Tensor input = input_is_parallel ? x : dist::scatter_to_region(x, tp, -1);
  Tensor partial;
  if (gemm) {
    partial = gemm(act ? mlp_activation(input, *act) : input, w_shard, Tensor());
  } else {
    partial = act ? activation_linear(input, *act, w_shard) : linear(input, w_shard);
  }
  Tensor y;
  if (sequence_parallel) {
    check_seq_dim(partial, seq_dim, op);
    y = dist::reduce_scatter_to_sequence(partial, tp, seq_dim);
  } else {
    y = dist::reduce_from_region(partial, tp);
  }
  if (!bias.defined()) return y;
  // Under sequence parallelism each rank adds the bias to its own rows: the bias gradient is a
  // partial sum, completed by copy_to_region's backward all-reduce.
  return add(y, sequence_parallel ? dist::copy_to_region(bias, tp) : bias);
}

Tensor shard_rows(const Tensor& full, int rank, int size) {
  return shard_dim(full, 0, rank, size, "shard_rows");
}

Tensor shard_cols(const Tensor& full, int rank, int size) {
  TD_CHECK(!full.defined() || full.dim() == 2, "shard_cols: expected a 2-D [n, m] tensor, got ",
           describe(full));
  return shard_dim(full, 1, rank, size, "shard_cols");
}

}  // namespace td::parallel
