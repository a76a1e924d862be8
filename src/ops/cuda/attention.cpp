#if TD_WITH_CUDA
#include "ops/cuda/attention.h"

#include <cmath>

#include "attention/flash_attention.cuh"
#include "ops/cuda/launch.h"

namespace td::cuda_ops {

namespace {

kernels::AttentionShape shape_of(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                 float scale, const char* op) {
  kernels::AttentionShape s;
  s.B = q.size(0);
  s.H = q.size(1);
  s.Tq = q.size(2);
  s.D = q.size(3);
  s.Hkv = k.size(1);
  s.Tk = k.size(2);
  s.Dv = v.size(3);
  s.causal = causal;
  s.scale = scale;
  TD_CHECK(s.D <= kernels::kMaxRefHeadDim && s.Dv <= kernels::kMaxRefHeadDim, op,
           ": head dims up to ", kernels::kMaxRefHeadDim, " on CUDA, got query/key ", s.D,
           " and value ", s.Dv);
  return s;
}

}  // namespace

AttentionForward flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         bool is_causal, float scale) {
  const char* op = "flash_attention_forward";
  check_same_cuda_device(op, q, {&k, &v});
  OnDevice on(q);
  const kernels::AttentionShape s = shape_of(q, k, v, is_causal, scale, op);
  AttentionForward r;
  r.out = Tensor::empty({s.B, s.H, s.Tq, s.Dv}, q.dtype(), q.device());
  r.lse = Tensor::empty({s.B, s.H, s.Tq}, DType::Float32, q.device());
  if (r.out.numel() == 0) return r;
  if (s.Tk == 0) {
    // No keys: NaN rows, as the CPU backend (softmax over nothing).
    r.out.fill_(NAN);
    r.lse.fill_(-INFINITY);
    return r;
  }
  const Tensor qc = contiguous_of(q), kc = contiguous_of(k), vc = contiguous_of(v);
  TD_DISPATCH_FLOATING(q.dtype(), op, [&]<typename T>() {
    kernels::attention_forward<cuda_t<T>>(ptr<T>(qc), ptr<T>(kc), ptr<T>(vc), ptr<T>(r.out),
                                          r.lse.data_ptr<float>(), s, stream_of(q));
  });
  return r;
}

std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const Tensor& out, const Tensor& lse,
                                                            bool is_causal, float scale) {
  const char* op = "flash_attention_backward";
  check_same_cuda_device(op, q, {&k, &v, &grad_out, &out, &lse});
  OnDevice on(q);
  const kernels::AttentionShape s = shape_of(q, k, v, is_causal, scale, op);
  Tensor dq = Tensor::empty(q.sizes(), q.dtype(), q.device());
  Tensor dk = Tensor::empty(k.sizes(), k.dtype(), k.device());
  Tensor dv = Tensor::empty(v.sizes(), v.dtype(), v.device());
  if (s.Tq == 0 || s.Tk == 0 || s.B == 0 || s.H == 0) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  const Tensor gc = contiguous_of(grad_out), qc = contiguous_of(q), kc = contiguous_of(k),
               vc = contiguous_of(v), oc = contiguous_of(out), lc = contiguous_of(lse);
  // delta = rowsum(grad_out * out), fp32 [B, H, Tq]; freed stream-ordered after the kernels.
  const Tensor delta = scratch_bytes(q, static_cast<size_t>(s.B * s.H * s.Tq) * sizeof(float));
  TD_DISPATCH_FLOATING(q.dtype(), op, [&]<typename T>() {
    kernels::attention_backward<cuda_t<T>>(ptr<T>(gc), ptr<T>(qc), ptr<T>(kc), ptr<T>(vc),
                                           ptr<T>(oc), lc.data_ptr<float>(), ptr<T>(dq), ptr<T>(dk),
                                           ptr<T>(dv), delta.data_ptr<float>(), s, stream_of(q));
  });
  return {dq, dk, dv};
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
