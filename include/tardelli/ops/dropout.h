#pragma once
#include "tardelli/core/rng.h"
#include "tardelli/core/tensor.h"

namespace td {

// Zeroes each element with probability p and scales the rest by 1/(1-p). The mask comes from
// the Philox stream (element i keeps iff uniform_i >= p), so the backward regenerates it from
// (seed, offset) instead of storing it, and the CUDA backend draws the same mask.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);
// The kernel: y = x * mask(st) / (1-p).
Tensor dropout_apply(const Tensor& x, double p, const PhiloxState& st);

}  // namespace td
