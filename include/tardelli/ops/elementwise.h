#pragma once
// Elementwise arithmetic with broadcasting and type promotion; all differentiable (gradients
// are summed back over broadcast dims). bf16/f16 compute in fp32.
#include "tardelli/core/tensor.h"

namespace td {

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha*b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// Scalar forms: the scalar takes the tensor's dtype (float if the tensor is integral and the
// scalar is not), like torch's wrapped numbers.
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rdiv(const Tensor& a, double b);  // b / a
Tensor pow(const Tensor& a, double exponent);
Tensor rpow(const Tensor& a, double base);  // base ** a
Tensor clamp(const Tensor& a, std::optional<double> min, std::optional<double> max);

Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor sin(const Tensor& a);
Tensor cos(const Tensor& a);

// Comparisons return bool tensors (not differentiable).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_not(const Tensor& a);

// In-place forms, for optimizers and no-grad code: an error on a tensor that requires grad
// while grad mode is on.
Tensor& add_(Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor& mul_(Tensor& a, double b);

// Sums `grad` over the dims that broadcasting expanded, so it has shape `shape` (the backward
// of every broadcasting op).
Tensor sum_to(const Tensor& grad, const Shape& shape);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return rsub(b, a); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(double a, const Tensor& b) { return rdiv(b, a); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace td
