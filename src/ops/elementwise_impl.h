#pragma once
// Shared helpers for elementwise op front-ends (internal header).
#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "ops/cuda/elementwise.h"  // ops::EwSpec (Note [Elementwise op names]); no CUDA headers
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"

namespace td::ops {

// True when t is on a device whose backend is built (CUDA): the op runs there instead of on the
// CPU loops, with the same argument checks and autograd recording.
inline bool on_cuda_backend(const Tensor& t) {
#if TD_WITH_CUDA
  return t.is_cuda();
#else
  (void)t;
  return false;
#endif
}

// Not differentiable: out = f(a, b) in dtype `rt` (inputs converted), broadcasting.
// `spec` names the op for the CUDA backend, which cannot run `f` (Note [Elementwise op names]).
template <typename F>
Tensor binary_map(const char* op, const Tensor& a, const Tensor& b, DType rt, EwSpec spec, F f) {
  check_defined(a, op, "input");
  check_defined(b, op, "other");
  check_same_device(a, b, op);
  if (!on_cuda_backend(a)) check_cpu(a, op);
  Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  Tensor ac = a.dtype() == rt ? a : to_dtype(a.detach(), rt);
  Tensor bc = b.dtype() == rt ? b : to_dtype(b.detach(), rt);
  Tensor out = Tensor::empty(shape, rt, a.device());
#if TD_WITH_CUDA
  if (out.is_cuda()) {
    cuda_ops::ew_binary(op, spec, out, ac.detach(), bc.detach());
    return out;
  }
#endif
  TD_DISPATCH_NUMERIC(rt, op, [&]<typename T>() { cpu::map<T, T, T>(out, f, {ac, bc}); });
  return out;
}

// Not differentiable: out = f(a) in a's dtype (floating only unless `allow_int`).
template <typename F>
Tensor unary_map(const char* op, const Tensor& a, EwSpec spec, F f) {
  check_defined(a, op, "input");
  if (!on_cuda_backend(a)) check_cpu(a, op);
  Tensor out = Tensor::empty(a.sizes(), a.dtype(), a.device());
#if TD_WITH_CUDA
  if (out.is_cuda()) {
    cuda_ops::ew_unary(op, spec, out, a.detach());
    return out;
  }
#endif
  TD_DISPATCH_NUMERIC(a.dtype(), op, [&]<typename T>() { cpu::map<T, T>(out, f, {a}); });
  return out;
}

template <typename F>
Tensor unary_float_map(const char* op, const Tensor& a, EwSpec spec, F f) {
  check_defined(a, op, "input");
  check_not_float8(a, op);
  if (!on_cuda_backend(a)) check_cpu(a, op);
  Tensor in = a.is_floating_point() ? a : to_dtype(a.detach(), DType::Float32);
  Tensor out = Tensor::empty(in.sizes(), in.dtype(), in.device());
#if TD_WITH_CUDA
  if (out.is_cuda()) {
    cuda_ops::ew_unary(op, spec, out, in.detach());
    return out;
  }
#endif
  TD_DISPATCH_FLOATING(in.dtype(), op, [&]<typename T>() { cpu::map<T, T>(out, f, {in}); });
  return out;
}

// Gradient w.r.t. a broadcast input: summed over broadcast dims, in the input's dtype.
inline Tensor reduce_grad(const Tensor& g, const Tensor& input) {
  Tensor r = sum_to(g, input.sizes());
  return r.dtype() == input.dtype() ? r : to_dtype(r, input.dtype());
}

}  // namespace td::ops
