#if TD_WITH_CUDA
#include "ops/cuda/attention.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "attention/cudnn_attention.cuh"
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

// TD_CUDNN_ATTENTION (Note [cuDNN attention] in kernels/attention/cudnn_attention.cuh): unset or
// empty = cuDNN where it takes the shape, 0 = never, 1 = always for bf16/fp16 (a refusal is an
// error). Read on every call, so a test or a benchmark can switch paths within one process.
enum class CudnnMode { Auto, Off, Required };
CudnnMode cudnn_mode(const char* op) {
  const char* e = std::getenv("TD_CUDNN_ATTENTION");
  if (e == nullptr || *e == '\0') return CudnnMode::Auto;
  if (std::strcmp(e, "0") == 0) return CudnnMode::Off;
  TD_CHECK(std::strcmp(e, "1") == 0, op, ": TD_CUDNN_ATTENTION must be 0 or 1 (or unset), got '", e,
           "'");
  return CudnnMode::Required;
}

// TD_CUDNN_ATTENTION_DETERMINISTIC=0 lets cuDNN's backward use atomics (as torch's default).
bool cudnn_deterministic() {
  const char* e = std::getenv("TD_CUDNN_ATTENTION_DETERMINISTIC");
  return e == nullptr || std::strcmp(e, "0") != 0;
}

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// The dtype cuDNN would run, or nullopt when the own kernels must: fp32, head dims cuDNN never
// takes (not a multiple of 8, above 256), misaligned pointers, or TD_CUDNN_ATTENTION=0. The
// plans (cuDNN's own support check) decide the rest.
std::optional<kernels::AttentionDType> cudnn_candidate(const kernels::AttentionShape& s,
                                                       CudnnMode mode, const char* op,
                                                       std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  if (mode == CudnnMode::Off) return std::nullopt;
  std::optional<kernels::AttentionDType> dt;
  if (first.dtype() == DType::BFloat16) dt = kernels::AttentionDType::BFloat16;
  if (first.dtype() == DType::Float16) dt = kernels::AttentionDType::Float16;
  const char* why = nullptr;
  if (!dt) {
    why = "cuDNN attention runs bf16 and fp16 only";
  } else if (s.D % 8 != 0 || s.Dv % 8 != 0 || s.D > 256 || s.Dv > 256) {
    why = "cuDNN attention needs head dims that are multiples of 8, up to 256";
  } else {
    for (const Tensor* t : ts) {
      if (!aligned16(*t)) why = "cuDNN attention needs 16-byte aligned tensors";
    }
  }
  if (why == nullptr) return dt;
  TD_CHECK(mode != CudnnMode::Required, op, ": TD_CUDNN_ATTENTION=1 but ", why, " (got ",
           dtype_name(first.dtype()), ", D = ", s.D, ", Dv = ", s.Dv, ")");
  return std::nullopt;
}

// A refused plan: the own kernels run, unless TD_CUDNN_ATTENTION=1 asked for cuDNN.
void check_refusal(const kernels::CudnnAttentionPlan& plan, CudnnMode mode, const char* op,
                   const kernels::AttentionShape& s) {
  TD_CHECK(plan.supported || mode != CudnnMode::Required, op,
           ": TD_CUDNN_ATTENTION=1 but cuDNN does not run B = ", s.B, ", H = ", s.H,
           ", Hkv = ", s.Hkv, ", Tq = ", s.Tq, ", Tk = ", s.Tk, ", D = ", s.D, ", Dv = ", s.Dv,
           s.causal ? " causal" : " non-causal", ": ", plan.refusal);
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
  const CudnnMode mode = cudnn_mode(op);
  if (auto dt = cudnn_candidate(s, mode, op, {&qc, &kc, &vc, &r.out})) {
    const kernels::CudnnAttentionPlan& plan = kernels::cudnn_attention_forward_plan(s, *dt);
    check_refusal(plan, mode, op, s);
    if (plan.supported) {
      const Tensor ws = scratch_bytes(q, plan.workspace_bytes);  // freed stream-ordered
      kernels::cudnn_attention_forward(
          qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), r.out.data_ptr(), r.lse.data_ptr<float>(),
          plan.workspace_bytes ? ws.data_ptr() : nullptr, s, *dt, stream_of(q));
      kernels::note_attention_backend(false, kernels::AttentionBackend::Cudnn);
      return r;
    }
  }
  kernels::note_attention_backend(false, kernels::AttentionBackend::Own);
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
  // The lse of either path's forward serves either backward (Note [cuDNN attention]).
  const CudnnMode mode = cudnn_mode(op);
  if (auto dt = cudnn_candidate(s, mode, op, {&qc, &kc, &vc, &gc, &oc, &lc, &dq, &dk, &dv})) {
    const bool det = cudnn_deterministic();
    const kernels::CudnnAttentionPlan& plan = kernels::cudnn_attention_backward_plan(s, *dt, det);
    check_refusal(plan, mode, op, s);
    if (plan.supported) {
      const Tensor ws = scratch_bytes(q, plan.workspace_bytes);  // freed stream-ordered
      kernels::cudnn_attention_backward(
          gc.data_ptr(), qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), oc.data_ptr(),
          lc.data_ptr<float>(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
          plan.workspace_bytes ? ws.data_ptr() : nullptr, s, *dt, det, stream_of(q));
      kernels::note_attention_backend(true, kernels::AttentionBackend::Cudnn);
      return {dq, dk, dv};
    }
  }
  kernels::note_attention_backend(true, kernels::AttentionBackend::Own);
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
