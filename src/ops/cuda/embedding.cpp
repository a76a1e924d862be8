// CUDA side of embedding / embedding_backward: tensors to kernels/embedding.
#if TD_WITH_CUDA

#include "ops/cuda/embedding.h"

#include "embedding/embedding.cuh"
#include "indexing/indexing.cuh"
#include "ops/cuda/launch.h"
#include "runtime/cuda_check.cuh"
#include "runtime/deferred_checks.cuh"

namespace td::cuda_ops {
namespace {

// Calls f.template operator()<int32_t or int64_t>() for the index dtype.
template <typename F>
decltype(auto) dispatch_index(const Tensor& indices, const char* op, F&& f) {
  switch (indices.dtype()) {
    case DType::Int32:
      return f.template operator()<int32_t>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    default:
      break;
  }
  TD_ERROR(op, ": indices must be int32 or int64, got ", describe(indices));
}

// The first out-of-range index (in position order) is a td::Error with the CPU backend's text,
// thrown at the next read of device memory to the host (Note [Deferred device checks]): the
// kernels below gather zeros for it and drop its gradient meanwhile, and the training step does
// not wait for the verdict.
void check_indices(const char* op, const Tensor& idx, int64_t num_embeddings) {
  if (idx.numel() == 0) return;
  Tensor flag = scratch_bytes(idx, sizeof(unsigned long long));
  dispatch_index(idx, op, [&]<typename I>() {
    kernels::mark_bad_index<I>(idx.data_ptr<I>(), idx.numel(), num_embeddings, flag.data_ptr(),
                               stream_of(idx));
  });
  cuda::defer_check(
      cuda::current_stream(idx.device().index),
      [op = std::string(op), idx, flag, num_embeddings]() -> std::string {
        unsigned long long pos = 0;
        TD_CUDA_CHECK(cudaMemcpy(&pos, flag.data_ptr(), sizeof(pos), cudaMemcpyDeviceToHost));
        if (pos == ~0ULL) return "";
        int64_t value = 0;
        const size_t es = idx.element_size();
        if (es == sizeof(int32_t)) {
          int32_t v = 0;
          TD_CUDA_CHECK(cudaMemcpy(&v, idx.data_ptr<int32_t>() + pos, es, cudaMemcpyDeviceToHost));
          value = v;
        } else {
          TD_CUDA_CHECK(
              cudaMemcpy(&value, idx.data_ptr<int64_t>() + pos, es, cudaMemcpyDeviceToHost));
        }
        return detail::str_cat(op, ": index ", value, " at position ", pos,
                               " is out of range for num_embeddings ", num_embeddings,
                               " (valid: 0..", num_embeddings - 1, ")");
      });
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const char* op = "embedding";
  check_same_cuda_device(op, weight, {&indices});
  OnDevice on(weight);
  Tensor w = contiguous_of(weight.detach());
  Tensor idx = contiguous_of(indices.detach());
  const int64_t V = w.size(0), D = w.size(1), n = idx.numel();
  check_indices(op, idx, V);
  Shape out_shape = indices.sizes();
  out_shape.push_back(D);
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  if (n == 0 || D == 0) return out;
  // out[i, :] = w[idx[i], :]: index_select along dim 0 of the [V, D] table.
  dispatch_index(idx, op, [&]<typename I>() {
    kernels::index_select<I>(w.data_ptr(), out.data_ptr(), idx.data_ptr<I>(), 1, V, n, D,
                             w.element_size(), stream_of(w));
  });
  return out;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings) {
  const char* op = "embedding_backward";
  check_same_cuda_device(op, grad, {&indices});
  OnDevice on(grad);
  Tensor g = contiguous_of(grad.detach());
  Tensor idx = contiguous_of(indices.detach());
  const int64_t n = idx.numel(), D = grad.sizes().back();
  check_indices(op, idx, num_embeddings);
  Tensor out = Tensor::empty({num_embeddings, D}, grad.dtype(), grad.device());
  if (num_embeddings == 0 || D == 0) return out;
  dispatch_index(idx, op, [&]<typename I>() {
    const size_t bytes = kernels::embedding_backward_scratch_bytes<I>(n, num_embeddings);
    Tensor scratch = scratch_bytes(g, bytes);
    TD_DISPATCH_FLOATING(g.dtype(), op, [&]<typename T>() {
      kernels::embedding_backward<cuda_t<T>, I>(ptr<T>(g), idx.data_ptr<I>(), ptr<T>(out), n,
                                                num_embeddings, D, scratch.data_ptr(), bytes,
                                                stream_of(g));
    });
  });
  return out;
}

}  // namespace td::cuda_ops

#endif  // TD_WITH_CUDA
