#pragma once
// CUDA side of the elementwise front-ends (src/ops/elementwise_impl.h); internal.
//
// Note [Elementwise op names]: the CPU front-ends hand their math to cpu::map as lambdas, which
// a GPU cannot run, so each call also names its op with an ops::EwSpec. This header has no CUDA
// headers and is included in every build (elementwise_impl.h takes EwSpec arguments); the
// cuda_ops functions exist only in CUDA builds. The list is kernels::EwOp's
// (kernels/elementwise/elementwise.cuh), in the same order; see there for each op's formula.
#include <cstdint>

#include "tardelli/core/tensor.h"

namespace td::ops {

enum class Ew : uint8_t {
  Neg,
  Abs,
  Exp,
  Log,
  Tanh,
  Sqrt,
  Rsqrt,
  Sigmoid,
  Sin,
  Cos,
  AddScalar,
  MulScalar,
  DivScalar,
  RdivScalar,
  Square,
  PowScalar,
  RpowScalar,
  Clamp,
  LogicalNot,
  Add,
  AddAlpha,
  AddInplace,
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  PowLogBackward,
  MaxBackward,
  MinBackward,
  ClampBackward,
  TanhBackward,
  SqrtBackward,
  RsqrtBackward,
  SigmoidBackward,
  SinBackward,
  CosBackward,
  AbsBackward,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  kCount
};

// An op and its scalar parameters (alpha, the scalar operand, clamp's bounds).
struct EwSpec {
  Ew op;
  double s0 = 0;
  double s1 = 0;
};

}  // namespace td::ops

namespace td::cuda_ops {

// out = op(a) elementwise; out (any strides, a's shape) and a on one CUDA device, a already in
// the op's input dtype (out's dtype, or bool out for LogicalNot).
void ew_unary(const char* opname, const ops::EwSpec& spec, const Tensor& out, const Tensor& a);
// out = op(a, b); a and b of one dtype, broadcast to out's shape (out bool for comparisons).
void ew_binary(const char* opname, const ops::EwSpec& spec, const Tensor& out, const Tensor& a,
               const Tensor& b);

}  // namespace td::cuda_ops
