#if TD_WITH_CUDA
#include "ops/cuda/norm.h"

#include "norm/norm.cuh"
#include "ops/cuda/launch.h"
#include "tardelli/ops/copy.h"

namespace td::cuda_ops {

namespace {

// weight / bias as contiguous fp32 [N] on x's device (the kernels read fp32 affine params).
Tensor fp32_param(const Tensor& p) {
  if (!p.defined()) return p;
  Tensor d = p.detach();
  if (d.dtype() != DType::Float32) d = to_dtype(d, DType::Float32);
  return contiguous_of(d);
}

NormForward norm_forward(const char* op, const Tensor& x, int64_t n, const Tensor& weight,
                         const Tensor& bias, double eps, bool layer) {
  check_same_cuda_device(op, x, {&weight, &bias});
  OnDevice on(x);
  const Tensor xc = contiguous_of(x.detach());
  const Tensor w = fp32_param(weight), b = fp32_param(bias);
  const int64_t rows = x.numel() / n;
  NormForward f;
  f.y = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (layer) f.mean = Tensor::empty({rows}, DType::Float32, x.device());
  f.rstd = Tensor::empty({rows}, DType::Float32, x.device());
  if (rows == 0) return f;
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    kernels::norm_forward<cuda_t<T>>(
        ptr<T>(xc), ptr<T>(f.y), layer ? f.mean.data_ptr<float>() : nullptr,
        f.rstd.data_ptr<float>(), ptr_or_null<float>(w), ptr_or_null<float>(b), rows, n,
        static_cast<float>(eps), layer, stream_of(x));
  });
  return f;
}

// Returns {dx, dw (fp32 [N] or undefined), db (fp32 [N] or undefined)}.
std::tuple<Tensor, Tensor, Tensor> norm_backward(const char* op, const Tensor& grad,
                                                 const Tensor& x, const Tensor& mean,
                                                 const Tensor& rstd, const Tensor& weight,
                                                 bool want_dw, bool want_db, int64_t n) {
  check_same_cuda_device(op, x, {&grad, &mean, &rstd, &weight});
  OnDevice on(x);
  const Tensor xc = contiguous_of(x.detach()), gc = contiguous_of(grad.detach());
  const Tensor mc = mean.defined() ? contiguous_of(mean.detach()) : Tensor();
  const Tensor rc = contiguous_of(rstd.detach());
  const Tensor w = fp32_param(weight);
  const int64_t rows = x.numel() / n;
  Tensor dx = Tensor::empty(x.sizes(), x.dtype(), x.device());
  Tensor dw = want_dw ? Tensor::empty({n}, DType::Float32, x.device()) : Tensor();
  Tensor db = want_db ? Tensor::empty({n}, DType::Float32, x.device()) : Tensor();
  const size_t nbytes = kernels::norm_backward_scratch_bytes(rows, n, want_dw, want_db);
  Tensor scratch = nbytes > 0 ? scratch_bytes(x, nbytes) : Tensor();
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    kernels::norm_backward<cuda_t<T>>(
        ptr<T>(gc), ptr<T>(xc), ptr_or_null<float>(mc), rc.data_ptr<float>(), ptr_or_null<float>(w),
        ptr<T>(dx), ptr_or_null<float>(dw), ptr_or_null<float>(db), rows, n,
        scratch.defined() ? scratch.data_ptr() : nullptr, stream_of(x));
  });
  return {dx, dw, db};
}

// An fp32 [N] sum as a tensor of the given shape and dtype (rounded once, as the CPU).
Tensor shaped(const Tensor& sum32, const Shape& sizes, DType dtype) {
  Tensor t = dtype == DType::Float32 ? sum32 : to_dtype(sum32, dtype);
  return t.view(sizes);
}

}  // namespace

NormForward layer_norm_forward(const Tensor& x, int64_t norm_numel, const Tensor& weight,
                               const Tensor& bias, double eps) {
  return norm_forward("layer_norm", x, norm_numel, weight, bias, eps, true);
}

NormForward rms_norm_forward(const Tensor& x, int64_t norm_numel, const Tensor& weight,
                             double eps) {
  return norm_forward("rms_norm", x, norm_numel, weight, Tensor(), eps, false);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x,
                                                       const Tensor& mean, const Tensor& rstd,
                                                       const Tensor& weight, bool has_bias,
                                                       int64_t norm_numel) {
  auto [dx, dw, db] = norm_backward("layer_norm_backward", grad, x, mean, rstd, weight,
                                    weight.defined(), has_bias, norm_numel);
  Tensor dweight = weight.defined() ? shaped(dw, weight.sizes(), weight.dtype()) : Tensor();
  // dbias has the weight's shape and dtype when there is a weight, else [N] in x's dtype.
  Tensor dbias;
  if (has_bias) {
    dbias = weight.defined() ? shaped(db, weight.sizes(), weight.dtype())
                             : shaped(db, {norm_numel}, x.dtype());
  }
  return {dx, dweight, dbias};
}

std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                                            const Tensor& weight, int64_t norm_numel) {
  auto [dx, dw, db] = norm_backward("rms_norm_backward", grad, x, Tensor(), rstd, weight,
                                    weight.defined(), false, norm_numel);
  return {dx, weight.defined() ? shaped(dw, weight.sizes(), weight.dtype()) : Tensor()};
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
