#include "tardelli/nn/embedding.h"

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/embedding.h"
#include "tardelli/ops/factory.h"

namespace td::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator* gen)
    : UnaryModule("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  TD_CHECK(num_embeddings >= 0 && embedding_dim >= 0,
           "Embedding: num_embeddings and embedding_dim must be >= 0, got ", num_embeddings,
           " and ", embedding_dim);
  autograd::NoGradGuard ng;
  weight = register_parameter("weight", randn({num_embeddings, embedding_dim}, {}, gen));
}

Tensor Embedding::forward(const Tensor& indices) {
  return embedding(weight, indices);
}

}  // namespace td::nn
