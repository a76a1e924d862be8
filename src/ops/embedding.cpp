#include "tardelli/ops/embedding.h"

#include <cstring>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/factory.h"
#if TD_WITH_CUDA
#include "ops/cuda/embedding.h"
#endif

// Note [Deterministic embedding backward]: the gradient of a lookup is a scatter-add, where
// atomics (or per-thread tables merged in arbitrary order) would make the result depend on
// thread timing. Instead the positions are bucketed by vocab row with a stable counting sort
// (positions stay in increasing order inside a bucket), then vocab rows are split across
// threads: each row sums its grad rows in position order in fp32. Every output row is written
// by exactly one thread, in an order fixed by the indices alone.

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

void check_index_dtype(const Tensor& indices, const char* op) {
  ops::check_defined(indices, op, "indices");
  TD_CHECK(is_integral(indices.dtype()), op, ": indices must be int32 or int64, got ",
           describe(indices));
}

// Indices as int64 values in a flat vector, validated against [0, num_embeddings).
std::vector<int64_t> checked_indices(const Tensor& indices, int64_t num_embeddings,
                                     const char* op) {
  check_index_dtype(indices, op);
  ops::check_cpu(indices, op);
  std::vector<int64_t> idx = to_vector<int64_t>(indices);
  for (size_t i = 0; i < idx.size(); ++i) {
    TD_CHECK(idx[i] >= 0 && idx[i] < num_embeddings, op, ": index ", idx[i], " at position ", i,
             " is out of range for num_embeddings ", num_embeddings, " (valid: 0..",
             num_embeddings - 1, ")");
  }
  return idx;
}

// The lookup without autograd: the CPU backend's kernel.
Tensor embedding_cpu(const Tensor& weight, const Tensor& indices) {
  const char* op = "embedding";
  ops::check_cpu(weight, op);
  const int64_t V = weight.size(0), D = weight.size(1);
  std::vector<int64_t> idx = checked_indices(indices, V, op);
  Shape out_shape = indices.sizes();
  out_shape.push_back(D);
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  Tensor w = weight.detach().contiguous();
  const char* src = static_cast<const char*>(w.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const size_t row_bytes = static_cast<size_t>(D) * w.element_size();
  const int64_t n = static_cast<int64_t>(idx.size());
  if (row_bytes > 0) {
    cpu::parallel_for(n, std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(D, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t i = b; i < e; ++i) {
                          std::memcpy(dst + i * row_bytes, src + idx[i] * row_bytes, row_bytes);
                        }
                      });
  }
  return out;
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const char* op = "embedding";
  ops::check_defined(weight, op, "weight");
  TD_CHECK(weight.dim() == 2, op, ": weight must be 2-D [num_embeddings, embedding_dim], got ",
           describe(weight));
  check_index_dtype(indices, op);
  Tensor out;
#if TD_WITH_CUDA
  if (weight.is_cuda()) out = cuda_ops::embedding(weight, indices);
#endif
  if (!out.defined()) out = embedding_cpu(weight, indices);
  const int64_t V = weight.size(0);
  if (weight.is_floating_point() && needs_grad({weight})) {
    record("EmbeddingBackward", {weight}, {&out},
           [indices = indices.detach(), V](const TensorList& g, const auto&) {
             return TensorList{embedding_backward(g[0], indices, V)};
           });
  }
  return out;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings) {
  const char* op = "embedding_backward";
  ops::check_defined(grad, op, "grad");
  ops::check_floating(grad, op);
  TD_CHECK(num_embeddings >= 0, op, ": num_embeddings must be >= 0, got ", num_embeddings);
  check_index_dtype(indices, op);
  TD_CHECK(grad.dim() == indices.dim() + 1 &&
               Shape(grad.sizes().begin(), grad.sizes().end() - 1) == indices.sizes(),
           op, ": grad ", describe(grad), " must have shape indices.shape + [embedding_dim] for ",
           "indices ", describe(indices));
#if TD_WITH_CUDA
  if (grad.is_cuda()) return cuda_ops::embedding_backward(grad, indices, num_embeddings);
#endif
  ops::check_cpu(grad, op);
  std::vector<int64_t> idx = checked_indices(indices, num_embeddings, op);
  const int64_t n = static_cast<int64_t>(idx.size());
  const int64_t D = grad.sizes().back();
  Tensor gc = grad.detach().contiguous();
  Tensor out = Tensor::empty({num_embeddings, D}, grad.dtype(), grad.device());

  // Stable counting sort of positions by index.
  std::vector<int64_t> start(num_embeddings + 1, 0), order(n);
  for (int64_t i = 0; i < n; ++i) ++start[idx[i] + 1];
  for (int64_t v = 0; v < num_embeddings; ++v) start[v + 1] += start[v];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[fill[idx[i]]++] = i;
  }

  TD_DISPATCH_FLOATING(grad.dtype(), op, [&]<typename T>() {
    const T* g = static_cast<const T*>(gc.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(D, 1));
    cpu::parallel_for(num_embeddings, grain, [&](int64_t vb, int64_t ve) {
      constexpr bool kFloat = std::is_same_v<T, float>;
      std::vector<float> scratch(kFloat ? 0 : D);
      for (int64_t v = vb; v < ve; ++v) {
        float* acc = kFloat ? reinterpret_cast<float*>(o + v * D) : scratch.data();
        for (int64_t j = 0; j < D; ++j) acc[j] = 0.0f;
        for (int64_t k = start[v]; k < start[v + 1]; ++k) {
          const T* row = g + order[k] * D;
          for (int64_t j = 0; j < D; ++j) acc[j] += static_cast<float>(row[j]);
        }
        if constexpr (!kFloat) {
          for (int64_t j = 0; j < D; ++j) o[v * D + j] = static_cast<T>(acc[j]);
        }
      }
    });
  });
  return out;
}

}  // namespace td
