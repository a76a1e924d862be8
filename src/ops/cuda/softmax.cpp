#if TD_WITH_CUDA
#include "ops/cuda/softmax.h"

#include "ops/cuda/launch.h"
#include "softmax/softmax.cuh"

namespace td::cuda_ops {

Tensor softmax_rows(const Tensor& x, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  OnDevice on(x);
  const Tensor xc = contiguous_of(x.detach());
  Tensor y = Tensor::empty(xc.sizes(), xc.dtype(), xc.device());
  const int64_t n = xc.dim() == 0 ? 1 : xc.sizes().back();
  if (xc.numel() == 0) return y;
  TD_DISPATCH_FLOATING(xc.dtype(), op, [&]<typename T>() {
    kernels::softmax_forward<cuda_t<T>>(ptr<T>(xc), ptr<T>(y), xc.numel() / n, n, log,
                                        stream_of(xc));
  });
  return y;
}

Tensor softmax_backward_rows(const Tensor& g, const Tensor& y, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_same_cuda_device(op, y, {&g});
  ops::check_same_dtype(g, y, op);
  OnDevice on(y);
  const Tensor gc = contiguous_of(g.detach()), yc = contiguous_of(y.detach());
  Tensor dx = Tensor::empty(yc.sizes(), yc.dtype(), yc.device());
  const int64_t n = yc.dim() == 0 ? 1 : yc.sizes().back();
  if (yc.numel() == 0) return dx;
  TD_DISPATCH_FLOATING(yc.dtype(), op, [&]<typename T>() {
    kernels::softmax_backward<cuda_t<T>>(ptr<T>(gc), ptr<T>(yc), ptr<T>(dx), yc.numel() / n, n, log,
                                         stream_of(yc));
  });
  return dx;
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
