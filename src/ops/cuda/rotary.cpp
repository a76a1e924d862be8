// CUDA side of rotary_kernel: tensors to kernels/rotary.
#if TD_WITH_CUDA

#include "ops/cuda/rotary.h"

#include "ops/cuda/launch.h"
#include "rotary/rotary.cuh"

namespace td::cuda_ops {

Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  const char* op = "apply_rotary";
  check_same_cuda_device(op, x, {&cos, &sin});
  OnDevice on(x);
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  Tensor cc = contiguous_of(cos.detach()), sc = contiguous_of(sin.detach());
  kernels::RotaryShape shape{x.size(0),
                             x.size(1),
                             x.size(2),
                             x.size(3),
                             {x.stride(0), x.stride(1), x.stride(2), x.stride(3)}};
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    kernels::rotary_forward<cuda_t<T>>(ptr<T>(x), shape, cc.data_ptr<float>(), sc.data_ptr<float>(),
                                       inverse, ptr<T>(out), stream_of(x));
  });
  return out;
}

}  // namespace td::cuda_ops

#endif  // TD_WITH_CUDA
