#pragma once
// FP8 (OCP E4M3FN and E5M2) element types and conversions for kernels. Header-only; depends on
// nothing outside the CUDA toolkit.
//
// Note [FP8 kernel conversions]: these repeat, step for step, the CPU's branch-free integer
// conversions (include/tardelli/core/fp8.h, Note [FP8 conversion code], where the steps are
// explained), so a GPU cast gives the CPU's codes bit for bit: round to nearest even, subnormals
// included; overflow to +-max when saturating, else NaN (E4M3FN) / +-inf (E5M2); NaN to S.1111.111
// / S.11111.11 keeping its sign. cuda_fp8.h's
// __nv_cvt_float_to_fp8 is not used because its NaN loses the sign and its E5M2 NaN code
// differs from torch's. They are __host__ __device__ so that a host test compares them with the
// CPU's for every float without a GPU (tests/ops/cuda/test_copy_cuda.cpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace td::kernels {

// td::Fp8Format's order.
enum class Fp8Kind : uint8_t { E4M3FN, E5M2 };

namespace fp8 {

__host__ __device__ __forceinline__ uint32_t bits_of(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

__host__ __device__ __forceinline__ float float_of(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

template <Fp8Kind K>
struct Layout {
  static constexpr bool kE5M2 = K == Fp8Kind::E5M2;
  static constexpr int M = kE5M2 ? 2 : 3;   // mantissa bits
  static constexpr int B = kE5M2 ? 15 : 7;  // exponent bias
  static constexpr uint32_t kMaxCode = kE5M2 ? 0x7B : 0x7E;
  static constexpr uint32_t kOverflowCode = kE5M2 ? 0x7C : 0x7F;
  static constexpr uint32_t kNanCode = 0x7F;
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 - B + 1) << 23;
  static constexpr uint32_t kRebias = static_cast<uint32_t>(127 - B) << 23;
};

}  // namespace fp8

template <Fp8Kind K>
__host__ __device__ __forceinline__ uint8_t fp8_encode(float x, bool saturate) {
  using L = fp8::Layout<K>;
  constexpr int M = L::M, B = L::B;
  const uint32_t u = fp8::bits_of(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t odd = (a >> (23 - M)) & 1u;
  const uint32_t normal = (a - L::kRebias + ((1u << (22 - M)) - 1u) + odd) >> (23 - M);
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);
  int32_t s = (151 - B - M) - static_cast<int32_t>(e != 0 ? e : 1u);
  s = s < 1 ? 1 : (s > 31 ? 31 : s);
  const uint32_t sub = (m + (1u << (s - 1)) - 1u + ((m >> s) & 1u)) >> s;
  uint32_t code = a < L::kMinNormalBits ? sub : normal;
  const uint32_t overflow = saturate ? L::kMaxCode : L::kOverflowCode;
  code = (a >= 0x7F800000u) | (code > L::kMaxCode) ? overflow : code;
  code = a > 0x7F800000u ? L::kNanCode : code;
  return static_cast<uint8_t>(sign | code);
}

template <Fp8Kind K>
__host__ __device__ __forceinline__ float fp8_decode(uint8_t c) {
  using L = fp8::Layout<K>;
  constexpr uint32_t M = L::M, B = L::B;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80) << 24;
  const uint32_t em = c & 0x7Fu;
  const uint32_t normal = (em << (23 - M)) + L::kRebias;
  const uint32_t p = static_cast<uint32_t>(em >= 4) + static_cast<uint32_t>(em >= 2);
  const uint32_t sub = em == 0 ? 0u : ((p + 128 - B - M) << 23) | ((em << (23 - p)) & 0x7FFFFFu);
  uint32_t r = em < (1u << M) ? sub : normal;
  if constexpr (L::kE5M2) {
    const uint32_t special = em == 0x7Cu ? 0x7F800000u : 0x7FC00000u;  // inf, NaN
    r = em >= 0x7Cu ? special : r;
  } else {
    r = em == 0x7Fu ? 0x7FC00000u : r;
  }
  return fp8::float_of(sign | r);
}

// The storage type of an FP8 element for the elementwise engine: loads decode to float, stores
// encode with the type's saturation (Saturate: overflow to +-max; else NaN / inf).
template <Fp8Kind K, bool Saturate>
struct Fp8 {
  static constexpr Fp8Kind kKind = K;
  static constexpr bool kSaturate = Saturate;
  uint8_t bits;
};

}  // namespace td::kernels
