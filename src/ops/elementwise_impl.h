#pragma once
// Shared helpers for elementwise op front-ends (internal header).
#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"

namespace td::ops {

// Not differentiable: out = f(a, b) in dtype `rt` (inputs converted), broadcasting.
template <typename F>
Tensor binary_map(const char* op, const Tensor& a, const Tensor& b, DType rt, F f) {
  check_defined(a, op, "input");
  check_defined(b, op, "other");
  check_cpu(a, op);
  check_same_device(a, b, op);
  Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  Tensor ac = a.dtype() == rt ? a : to_dtype(a.detach(), rt);
  Tensor bc = b.dtype() == rt ? b : to_dtype(b.detach(), rt);
  Tensor out = Tensor::empty(shape, rt, a.device());
  TD_DISPATCH_NUMERIC(rt, op, [&]<typename T>() { cpu::map<T, T, T>(out, f, {ac, bc}); });
  return out;
}

// Not differentiable: out = f(a) in a's dtype (floating only unless `allow_int`).
template <typename F>
Tensor unary_map(const char* op, const Tensor& a, F f) {
  check_defined(a, op, "input");
  check_cpu(a, op);
  Tensor out = Tensor::empty(a.sizes(), a.dtype(), a.device());
  TD_DISPATCH_NUMERIC(a.dtype(), op, [&]<typename T>() { cpu::map<T, T>(out, f, {a}); });
  return out;
}

template <typename F>
Tensor unary_float_map(const char* op, const Tensor& a, F f) {
  check_defined(a, op, "input");
  check_cpu(a, op);
  Tensor in = a.is_floating_point() ? a : to_dtype(a.detach(), DType::Float32);
  Tensor out = Tensor::empty(in.sizes(), in.dtype(), in.device());
  TD_DISPATCH_FLOATING(in.dtype(), op, [&]<typename T>() { cpu::map<T, T>(out, f, {in}); });
  return out;
}

// Gradient w.r.t. a broadcast input: summed over broadcast dims, in the input's dtype.
inline Tensor reduce_grad(const Tensor& g, const Tensor& input) {
  Tensor r = sum_to(g, input.sizes());
  return r.dtype() == input.dtype() ? r : to_dtype(r, input.dtype());
}

}  // namespace td::ops
