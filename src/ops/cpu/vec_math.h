#pragma once
// Vectorizable float math for CPU row kernels (internal header).
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tardelli/core/half.h"

namespace td::cpu {

// exp(x) for x in [-87.34, 88]: Cephes' range reduction by ln 2 and degree-6 polynomial, the
// core that vexp and vexp_clamped share (they differ only in how they bring x into range).
inline float exp_in_range(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting rounds to int
  const float tr = x * 1.44269504088896341f + kRound;
  const float n = tr - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((std::bit_cast<int32_t>(tr) - 0x4B400000 + 127) << 23);
}

// Note [Vectorized exp]: std::exp has no vector form without -ffast-math, and it dominates
// softmax. This is Cephes' expf (exp_in_range; measured max error 1.4 ulp on [-87, 88]).
// Special cases are blended with integer masks rather than `?:` on floats: under the default
// -ftrapping-math GCC turns float selects into branches around the polynomial and then refuses
// to vectorize the loop. Results below exp(-87.3) flush to 0, above exp(88) are +inf, NaN
// propagates.
inline float vexp(float x) {
  constexpr float kLo = -87.3365447504f, kHi = 88.0f;
  const int32_t ix = std::bit_cast<int32_t>(x), mag = ix & 0x7fffffff;
  // All-ones masks from integer compares, blended with bit operations.
  const int32_t nan = -static_cast<int32_t>(mag > 0x7f800000);
  const int32_t under = -static_cast<int32_t>(ix < 0 && mag > std::bit_cast<int32_t>(-kLo)) & ~nan;
  const int32_t over = -static_cast<int32_t>(ix >= 0 && mag > std::bit_cast<int32_t>(kHi)) & ~nan;
  const int32_t keep = ~(nan | under | over);
  const float xc = std::bit_cast<float>((ix & keep) | (std::bit_cast<int32_t>(kLo) & under) |
                                        (std::bit_cast<int32_t>(kHi) & over));
  const float y = exp_in_range(xc);
  return std::bit_cast<float>((std::bit_cast<int32_t>(y) & keep) | (ix & nan) |
                              (0x7f800000 & over));  // under: 0 bits
}

// Note [Clamped exp]: the same polynomial for arguments known to be finite (attention scores),
// and cheaper: the argument's magnitude is clamped to 87.34 by an integer min on its bits
// (exp(-87.34) ~ 1e-38 next to the sums >= 1 it meets) instead of vexp's masks for NaN,
// underflow and overflow. So a NaN argument gives a finite result, and exp(x) for x below
// -87.34 is ~1e-38 rather than 0: not for activations, whose outputs for large negative inputs
// would then be ~1e-37 instead of ~0 (Note [Activation numerics]). Equal to vexp on
// [-87.34, 87.34] bit for bit (both are exp_in_range there).
inline float vexp_clamped(float x) {
  constexpr int32_t kMaxMagnitude = 0x42aeac50;  // the bits of 87.3365447504f
  const int32_t ix = std::bit_cast<int32_t>(x);
  const int32_t mag = ix & 0x7fffffff;
  return exp_in_range(std::bit_cast<float>((ix & static_cast<int32_t>(0x80000000)) |
                                           (mag < kMaxMagnitude ? mag : kMaxMagnitude)));
}

inline float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// The shift that makes a row's exponentials safe: its max, or 0 for a row of -inf only (whose
// exponentials are then all 0, so its softmax is 0/0 = NaN, as in torch; shifting by -inf would
// give exp(-inf - -inf) = NaN inside the sum instead).
inline float softmax_shift(const float* x, int64_t n) {
  const float m = row_max(x, n);
  return m == -std::numeric_limits<float>::infinity() ? 0.0f : m;
}

// y[j] = exp(x[j] - shift) for j < n (y may be x); returns their sum (fp32, vector-lane order).
// Exp is vexp, or vexp_clamped where the arguments are known finite (attention scores).
template <float (*Exp)(float) = vexp>
inline float exp_shift_sum(const float* x, float* y, int64_t n, float shift) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) {
    const float e = Exp(x[j] - shift);
    y[j] = e;
    s += e;
  }
  return s;
}

// The input row as float: the data itself for float, else converted into `scratch`.
template <typename T>
const float* load_row(const T* src, int64_t n, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    for (int64_t j = 0; j < n; ++j) scratch[j] = static_cast<float>(src[j]);
    return scratch;
  }
}

// p[i] = v rounded to T. Inside a `#pragma omp simd` loop, assigning a BFloat16/Float16 object
// makes GCC keep a per-lane copy of the struct, and the loop stays scalar (the fused bf16 GELU
// ran ~12x slower than fp32); storing the 16-bit pattern keeps it vectorized.
template <typename T>
inline void store(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    reinterpret_cast<uint16_t*>(p)[i] = BFloat16::from_float(v);
  } else if constexpr (std::is_same_v<T, Float16>) {
    reinterpret_cast<uint16_t*>(p)[i] = Float16::from_float(v);
  } else {
    p[i] = static_cast<T>(v);
  }
}

}  // namespace td::cpu
