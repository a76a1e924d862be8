#pragma once
// td::nn::Embedding (torch.nn.Embedding without padding_idx / max_norm).
#include <cstdint>

#include "tardelli/core/rng.h"
#include "tardelli/nn/linear.h"

namespace td::nn {

// out[..., :] = weight[indices[...], :]; weight [num_embeddings, embedding_dim] ~ N(0, 1) as
// torch initializes it, drawn from `gen` (the default generator when null). forward takes an
// int32/int64 index tensor; an index out of range is a td::Error.
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator* gen = nullptr);
  Tensor forward(const Tensor& indices) override;

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }

  Tensor weight;

 private:
  int64_t num_embeddings_, embedding_dim_;
};

}  // namespace td::nn
