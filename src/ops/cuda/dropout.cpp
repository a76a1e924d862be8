// CUDA side of dropout_apply: tensors to kernels/dropout.
#if TD_WITH_CUDA

#include "ops/cuda/dropout.h"

#include "dropout/dropout.cuh"
#include "ops/cuda/launch.h"

namespace td::cuda_ops {

Tensor dropout_apply(const Tensor& x, float p, float scale, const PhiloxState& st) {
  OnDevice on(x);
  Tensor in = contiguous_of(x.detach());  // logical row-major order = memory order
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n == 0) return out;
  TD_DISPATCH_FLOATING(x.dtype(), "dropout", [&]<typename T>() {
    kernels::dropout_forward<cuda_t<T>>(ptr<T>(in), ptr<T>(out), n, p, scale, st.seed, st.offset,
                                        st.subsequence, stream_of(in));
  });
  return out;
}

}  // namespace td::cuda_ops

#endif  // TD_WITH_CUDA
