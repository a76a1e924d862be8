#pragma once
// Tensor-parallel modules (Megatron-core's ColumnParallelLinear, RowParallelLinear and
// VocabParallelEmbedding, tensor_parallel/layers.py): td::nn::UnaryModules that own this rank's
// weight shards as registered parameters and call the functions of tensor_parallel.h and
// vocab_parallel.h in forward. The group is a value given to the layer (no global state).
//
// Init (Note [Layout-independent init] in tensor_parallel.h): each layer draws the FULL weight
// exactly as the matching unsplit module draws it (nn::Linear: weight then bias from `gen`;
// nn::Embedding: the table from `gen`) and keeps its slice. So with the same generator state on
// every tp rank, the tp ranks together hold exactly the logical layer nn::Linear(in, out, bias,
// gen) would be, for every tp degree; from_full() slices an existing unsplit module instead.
// Every rank must pass a generator in the same state (the default generator after the same
// td::manual_seed, or one seeded alike): the draw is not communicated.
//
// Parameter names and shapes (the shards; `tp` = the group's size):
//   ColumnParallelLinear   weight [out/tp, in]       bias [out/tp]   (rows of the full ones)
//   RowParallelLinear      weight [out, in/tp]       bias [out]      (columns; bias replicated)
//   VocabParallelEmbedding weight [V_pad/tp, dim]                    (rows of the padded table)
// Divisibility (out, in) and option conflicts are td::Errors raised at construction, naming
// the layer.
#include <cstdint>
#include <memory>

#include "tardelli/core/rng.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/nn/embedding.h"
#include "tardelli/nn/linear.h"

namespace td::parallel {

using distributed::CommPtr;

struct ColumnParallelOptions {
  bool bias = true;
  // All-gather the output's last dim so every rank gets the full [..., out] (else [..., out/tp]).
  bool gather_output = false;
  // The input is this rank's chunk of dim seq_dim and is all-gathered first (Megatron's
  // sequence parallelism); cannot be combined with gather_output.
  bool sequence_parallel = false;
  int64_t seq_dim = 0;
};

struct RowParallelOptions {
  bool bias = true;
  // The input is this rank's [..., in/tp] slice (a column-parallel output); else the full input
  // [..., in], split here.
  bool input_is_parallel = true;
  // The output is reduce-scattered along seq_dim (this rank's chunk) instead of all-reduced;
  // requires input_is_parallel.
  bool sequence_parallel = false;
  int64_t seq_dim = 0;
};

struct VocabParallelOptions {
  // The output is reduce-scattered along seq_dim of the ids (this rank's chunk).
  bool sequence_parallel = false;
  int64_t seq_dim = 0;
  // The vocabulary is padded to a multiple of make_divisible_by * tp (padded_vocab_size).
  int64_t make_divisible_by = 128;
};

// y = x W^T + b with W [out, in] split by rows: y is [..., out/tp] (this rank's output columns)
// or the full [..., out] with gather_output.
class ColumnParallelLinear : public nn::UnaryModule {
 public:
  // Draws the full layer as nn::Linear(in, out, options.bias, gen) and keeps this rank's rows.
  ColumnParallelLinear(int64_t in_features, int64_t out_features, CommPtr tp,
                       ColumnParallelOptions options = {}, Generator* gen = nullptr);
  // This rank's rows of full_weight [out, in] and full_bias [out] (undefined: no bias; the
  // options' bias flag is ignored). The tensors are copied, not shared.
  ColumnParallelLinear(const Tensor& full_weight, const Tensor& full_bias, CommPtr tp,
                       ColumnParallelOptions options = {});
  // The shard of an existing unsplit layer (its bias decides whether this one has a bias).
  static std::shared_ptr<ColumnParallelLinear> from_full(const nn::Linear& full, CommPtr tp,
                                                         ColumnParallelOptions options = {});

  Tensor forward(const Tensor& x) override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }  // the full layer's
  int64_t out_features_per_rank() const { return weight.size(0); }
  bool has_bias() const { return bias.defined(); }
  const ColumnParallelOptions& options() const { return options_; }
  const CommPtr& tp() const { return tp_; }
  int tp_size() const { return tp_->size(); }
  int tp_rank() const { return tp_->rank(); }

  Tensor weight;  // [out/tp, in]
  Tensor bias;    // [out/tp]; undefined without bias

 private:
  void init_from_full(const Tensor& full_weight, const Tensor& full_bias);

  CommPtr tp_;
  ColumnParallelOptions options_;
  int64_t in_features_ = 0, out_features_ = 0;
};

// y = x W^T + b with W [out, in] split by columns; y is the full [..., out] (replicated over
// tp), or this rank's chunk of dim seq_dim under sequence parallelism.
class RowParallelLinear : public nn::UnaryModule {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, CommPtr tp,
                    RowParallelOptions options = {}, Generator* gen = nullptr);
  RowParallelLinear(const Tensor& full_weight, const Tensor& full_bias, CommPtr tp,
                    RowParallelOptions options = {});
  static std::shared_ptr<RowParallelLinear> from_full(const nn::Linear& full, CommPtr tp,
                                                      RowParallelOptions options = {});

  Tensor forward(const Tensor& x) override;

  int64_t in_features() const { return in_features_; }  // the full layer's
  int64_t in_features_per_rank() const { return weight.size(1); }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return bias.defined(); }
  const RowParallelOptions& options() const { return options_; }
  const CommPtr& tp() const { return tp_; }
  int tp_size() const { return tp_->size(); }
  int tp_rank() const { return tp_->rank(); }

  Tensor weight;  // [out, in/tp]
  Tensor bias;    // [out], the full bias on every rank; undefined without bias

 private:
  void init_from_full(const Tensor& full_weight, const Tensor& full_bias);

  CommPtr tp_;
  RowParallelOptions options_;
  int64_t in_features_ = 0, out_features_ = 0;
};

// out[..., dim] = table[ids[...]] with the table [num_embeddings, dim] padded with zero rows to
// padded_vocab() rows and split by rows: this rank holds ids [vocab_start(), vocab_start() +
// weight.size(0)). The padding rows are never looked up: an id outside [0, num_embeddings) is a
// td::Error, as in nn::Embedding.
class VocabParallelEmbedding : public nn::UnaryModule {
 public:
  // Draws the full table as nn::Embedding(num_embeddings, dim, gen) and keeps this rank's rows.
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, CommPtr tp,
                         VocabParallelOptions options = {}, Generator* gen = nullptr);
  // This rank's rows of full_weight [num_embeddings, dim] (copied).
  VocabParallelEmbedding(const Tensor& full_weight, CommPtr tp, VocabParallelOptions options = {});
  static std::shared_ptr<VocabParallelEmbedding> from_full(const nn::Embedding& full, CommPtr tp,
                                                           VocabParallelOptions options = {});

  Tensor forward(const Tensor& ids) override;

  int64_t num_embeddings() const { return num_embeddings_; }  // the true vocabulary size
  int64_t embedding_dim() const { return weight.size(1); }
  int64_t padded_vocab() const { return padded_vocab_; }
  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_end() const { return vocab_start_ + weight.size(0); }
  const VocabParallelOptions& options() const { return options_; }
  const CommPtr& tp() const { return tp_; }
  int tp_size() const { return tp_->size(); }
  int tp_rank() const { return tp_->rank(); }

  Tensor weight;  // [padded_vocab / tp, dim]

 private:
  void init_from_full(const Tensor& full_weight);

  CommPtr tp_;
  VocabParallelOptions options_;
  int64_t num_embeddings_ = 0, padded_vocab_ = 0, vocab_start_ = 0;
};

}  // namespace td::parallel
