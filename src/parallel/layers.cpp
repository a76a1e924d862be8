#include "tardelli/parallel/layers.h"

#include <string>
#include <utility>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/ops/factory.h"
#include "tardelli/parallel/tensor_parallel.h"
#include "tardelli/parallel/vocab_parallel.h"

namespace td::parallel {

namespace {

constexpr const char* kColumn = "ColumnParallelLinear";
constexpr const char* kRow = "RowParallelLinear";
constexpr const char* kVocab = "VocabParallelEmbedding";

std::string desc(const Tensor& t) {
  return t.defined() ? describe(t) : std::string("undefined");
}

void check_group(const CommPtr& tp, const char* layer) {
  TD_CHECK(tp != nullptr, layer, ": the tensor-parallel communicator is null");
}

// How the errors below name the group: "the tensor-parallel size 4 (group 'tp')".
std::string group_str(const CommPtr& tp) {
  return "the tensor-parallel size " + std::to_string(tp->size()) + " (group '" + tp->name() + "')";
}

void check_seq_dim_option(int64_t seq_dim, const char* layer) {
  TD_CHECK(seq_dim >= 0, layer, ": seq_dim must be >= 0, got ", seq_dim);
}

// The layout checks shared by the drawing and the slicing constructors; run before drawing so
// that a bad layout fails with the layer's message and leaves the generator untouched.
void check_column_layout(int64_t in, int64_t out, const CommPtr& tp,
                         const ColumnParallelOptions& o) {
  check_group(tp, kColumn);
  TD_CHECK(in >= 0 && out >= 0, kColumn, ": in_features and out_features must be >= 0, got ", in,
           " and ", out);
  TD_CHECK(out % tp->size() == 0, kColumn, ": out_features ", out, " is not divisible by ",
           group_str(tp));
  TD_CHECK(!(o.gather_output && o.sequence_parallel), kColumn,
           ": gather_output and sequence_parallel cannot be combined (the output of a "
           "sequence-parallel column layer stays split along its last dim)");
  check_seq_dim_option(o.seq_dim, kColumn);
}

void check_row_layout(int64_t in, int64_t out, const CommPtr& tp, const RowParallelOptions& o) {
  check_group(tp, kRow);
  TD_CHECK(in >= 0 && out >= 0, kRow, ": in_features and out_features must be >= 0, got ", in,
           " and ", out);
  TD_CHECK(in % tp->size() == 0, kRow, ": in_features ", in, " is not divisible by ",
           group_str(tp));
  TD_CHECK(!(o.sequence_parallel && !o.input_is_parallel), kRow,
           ": sequence_parallel requires input_is_parallel (as in Megatron)");
  check_seq_dim_option(o.seq_dim, kRow);
}

void check_vocab_layout(int64_t num_embeddings, int64_t dim, const CommPtr& tp,
                        const VocabParallelOptions& o) {
  check_group(tp, kVocab);
  TD_CHECK(num_embeddings > 0 && dim >= 0, kVocab,
           ": num_embeddings must be > 0 and embedding_dim >= 0, got ", num_embeddings, " and ",
           dim);
  TD_CHECK(o.make_divisible_by > 0, kVocab, ": make_divisible_by must be > 0, got ",
           o.make_divisible_by);
  check_seq_dim_option(o.seq_dim, kVocab);
}

void check_full_linear(const Tensor& w, const Tensor& b, const char* layer) {
  TD_CHECK(w.defined() && w.dim() == 2, layer, ": the full weight must be 2-D [out, in], got ",
           desc(w));
  TD_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), layer, ": the full bias ",
           desc(b), " must be [", w.size(0), "] to match the full weight ", describe(w));
}

void check_input(const Tensor& x, int64_t want_last, const char* layer, const char* what) {
  TD_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == want_last, layer, ".forward: input ",
           desc(x), " must have last dim ", want_last, " (", what, ")");
}

// Under sequence parallelism dim seq_dim of `t` is split over tp: it must be a dim of t other
// than the trailing `feature_dims` and (when `divisible`) be divisible by the group size.
void check_sequence(const Tensor& t, int64_t seq_dim, int64_t feature_dims, bool divisible,
                    const CommPtr& tp, const char* layer) {
  TD_CHECK(seq_dim < t.dim() - feature_dims, layer, ".forward: sequence parallelism splits dim ",
           seq_dim, ", which must be a non-feature dim of the input ", describe(t));
  TD_CHECK(!divisible || t.size(seq_dim) % tp->size() == 0, layer,
           ".forward: under sequence parallelism dim ", seq_dim, " of the input ", describe(t),
           " is split over ", group_str(tp), " and must be divisible by it");
}

// Note [Own storage]: a parameter must own its storage, or it would alias the full tensor
// (from_full's shard writing into the unsplit layer, a drawn layer keeping the whole full weight
// alive). shard_rows / shard_cols always return copies; the replicated row-parallel bias is
// copied here.
Tensor owned(const Tensor& t) {
  return t.detach().clone();
}

}  // namespace

// ---- ColumnParallelLinear ----

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, CommPtr tp,
                                           ColumnParallelOptions options, Generator* gen)
    : UnaryModule(kColumn), tp_(std::move(tp)), options_(options) {
  check_column_layout(in_features, out_features, tp_, options_);
  const nn::Linear full(in_features, out_features, options_.bias, gen);
  init_from_full(full.weight, full.bias);
}

ColumnParallelLinear::ColumnParallelLinear(const Tensor& full_weight, const Tensor& full_bias,
                                           CommPtr tp, ColumnParallelOptions options)
    : UnaryModule(kColumn), tp_(std::move(tp)), options_(options) {
  init_from_full(full_weight, full_bias);
}

void ColumnParallelLinear::init_from_full(const Tensor& full_weight, const Tensor& full_bias) {
  check_full_linear(full_weight, full_bias, kColumn);
  options_.bias = full_bias.defined();
  check_column_layout(full_weight.size(1), full_weight.size(0), tp_, options_);
  out_features_ = full_weight.size(0);
  in_features_ = full_weight.size(1);
  weight = register_parameter("weight", shard_rows(full_weight, tp_->rank(), tp_->size()));
  if (full_bias.defined())
    bias = register_parameter("bias", shard_rows(full_bias, tp_->rank(), tp_->size()));
}

std::shared_ptr<ColumnParallelLinear> ColumnParallelLinear::from_full(
    const nn::Linear& full, CommPtr tp, ColumnParallelOptions options) {
  return std::make_shared<ColumnParallelLinear>(full.weight, full.bias, std::move(tp), options);
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  check_input(x, in_features_, kColumn, "in_features");
  if (options_.sequence_parallel)
    check_sequence(x, options_.seq_dim, 1, /*divisible=*/false, tp_, kColumn);
  return column_parallel_linear(x, weight, bias, tp_, options_.gather_output,
                                options_.sequence_parallel, options_.seq_dim);
}

// ---- RowParallelLinear ----

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, CommPtr tp,
                                     RowParallelOptions options, Generator* gen)
    : UnaryModule(kRow), tp_(std::move(tp)), options_(options) {
  check_row_layout(in_features, out_features, tp_, options_);
  const nn::Linear full(in_features, out_features, options_.bias, gen);
  init_from_full(full.weight, full.bias);
}

RowParallelLinear::RowParallelLinear(const Tensor& full_weight, const Tensor& full_bias, CommPtr tp,
                                     RowParallelOptions options)
    : UnaryModule(kRow), tp_(std::move(tp)), options_(options) {
  init_from_full(full_weight, full_bias);
}

void RowParallelLinear::init_from_full(const Tensor& full_weight, const Tensor& full_bias) {
  check_full_linear(full_weight, full_bias, kRow);
  options_.bias = full_bias.defined();
  check_row_layout(full_weight.size(1), full_weight.size(0), tp_, options_);
  out_features_ = full_weight.size(0);
  in_features_ = full_weight.size(1);
  weight = register_parameter("weight", shard_cols(full_weight, tp_->rank(), tp_->size()));
  if (full_bias.defined()) bias = register_parameter("bias", owned(full_bias));
}

std::shared_ptr<RowParallelLinear> RowParallelLinear::from_full(const nn::Linear& full, CommPtr tp,
                                                                RowParallelOptions options) {
  return std::make_shared<RowParallelLinear>(full.weight, full.bias, std::move(tp), options);
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  if (options_.input_is_parallel) {
    check_input(x, weight.size(1), kRow, "this rank's slice of in_features: input_is_parallel");
  } else {
    check_input(x, in_features_, kRow, "in_features");
  }
  if (options_.sequence_parallel)
    check_sequence(x, options_.seq_dim, 1, /*divisible=*/true, tp_, kRow);
  return row_parallel_linear(x, weight, bias, tp_, options_.input_is_parallel,
                             options_.sequence_parallel, options_.seq_dim);
}

// ---- VocabParallelEmbedding ----

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim,
                                               CommPtr tp, VocabParallelOptions options,
                                               Generator* gen)
    : UnaryModule(kVocab), tp_(std::move(tp)), options_(options) {
  check_vocab_layout(num_embeddings, embedding_dim, tp_, options_);
  const nn::Embedding full(num_embeddings, embedding_dim, gen);
  init_from_full(full.weight);
}

VocabParallelEmbedding::VocabParallelEmbedding(const Tensor& full_weight, CommPtr tp,
                                               VocabParallelOptions options)
    : UnaryModule(kVocab), tp_(std::move(tp)), options_(options) {
  init_from_full(full_weight);
}

void VocabParallelEmbedding::init_from_full(const Tensor& full_weight) {
  TD_CHECK(full_weight.defined() && full_weight.dim() == 2, kVocab,
           ": the full table must be 2-D [num_embeddings, dim], got ", desc(full_weight));
  check_vocab_layout(full_weight.size(0), full_weight.size(1), tp_, options_);
  num_embeddings_ = full_weight.size(0);
  padded_vocab_ = padded_vocab_size(num_embeddings_, tp_->size(), options_.make_divisible_by);
  vocab_start_ = vocab_range(padded_vocab_, tp_->rank(), tp_->size()).start;
  weight = register_parameter(
      "weight", shard_vocab_rows(full_weight, padded_vocab_, tp_->rank(), tp_->size()));
}

std::shared_ptr<VocabParallelEmbedding> VocabParallelEmbedding::from_full(
    const nn::Embedding& full, CommPtr tp, VocabParallelOptions options) {
  return std::make_shared<VocabParallelEmbedding>(full.weight, std::move(tp), options);
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  TD_CHECK(ids.defined() && is_integral(ids.dtype()), kVocab,
           ".forward: ids must be an int32 or int64 tensor, got ", desc(ids));
  // Ids in [num_embeddings, padded_vocab) would look up zero padding rows: reject them as
  // nn::Embedding rejects ids beyond its table, so the padding never enters a result.
  const std::vector<int64_t> id = to_vector<int64_t>(ids);
  for (size_t i = 0; i < id.size(); ++i) {
    TD_CHECK(id[i] >= 0 && id[i] < num_embeddings_, kVocab, ".forward: id ", id[i], " at position ",
             i, " is out of range for num_embeddings ", num_embeddings_);
  }
  if (options_.sequence_parallel)
    check_sequence(ids, options_.seq_dim, 0, /*divisible=*/true, tp_, kVocab);
  return vocab_parallel_embedding(ids, weight, tp_, vocab_start_, options_.sequence_parallel,
                                  options_.seq_dim);
}

}  // namespace td::parallel
