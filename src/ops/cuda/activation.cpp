#if TD_WITH_CUDA
#include "ops/cuda/activation.h"

#include "activation/activation.cuh"
#include "ops/cuda/launch.h"

namespace td::cuda_ops {

namespace {

kernels::ActivationOp kernel_op(Activation act) {
  return static_cast<kernels::ActivationOp>(static_cast<int>(act));
}
static_assert(static_cast<int>(kernels::ActivationOp::GeluErf) ==
                  static_cast<int>(Activation::GeluErf) &&
              static_cast<int>(kernels::ActivationOp::GeluTanh) ==
                  static_cast<int>(Activation::GeluTanh) &&
              static_cast<int>(kernels::ActivationOp::Silu) == static_cast<int>(Activation::Silu) &&
              static_cast<int>(kernels::ActivationOp::Relu) == static_cast<int>(Activation::Relu));

}  // namespace

Tensor activation_forward(Activation act, const Tensor& x) {
  OnDevice on(x);
  const Tensor xc = contiguous_of(x.detach());
  Tensor y = Tensor::empty(x.sizes(), x.dtype(), x.device());
  TD_DISPATCH_FLOATING(x.dtype(), "activation", [&]<typename T>() {
    kernels::activation_forward<cuda_t<T>>(kernel_op(act), ptr<T>(xc), ptr<T>(y), xc.numel(),
                                           stream_of(x));
  });
  return y;
}

Tensor activation_backward(Activation act, const Tensor& grad, const Tensor& x) {
  check_same_cuda_device("activation_backward", x, {&grad});
  ops::check_same_dtype(grad, x, "activation_backward");
  OnDevice on(x);
  const Tensor xc = contiguous_of(x.detach()), gc = contiguous_of(grad.detach());
  Tensor dx = Tensor::empty(x.sizes(), x.dtype(), x.device());
  TD_DISPATCH_FLOATING(x.dtype(), "activation_backward", [&]<typename T>() {
    kernels::activation_backward<cuda_t<T>>(kernel_op(act), ptr<T>(gc), ptr<T>(xc), ptr<T>(dx),
                                            xc.numel(), stream_of(x));
  });
  return dx;
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
