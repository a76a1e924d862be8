#pragma once
// 8-bit floating point formats of the OCP FP8 specification (v1.0), as storage: E4M3FN (4
// exponent bits, bias 7, 3 mantissa bits, no infinities, NaN = S.1111.111, max 448) and E5M2
// (5 exponent bits, bias 15, 2 mantissa bits, IEEE-like: infinities S.11111.00, NaNs, max
// 57344). Arithmetic is never done in them: FP8 GEMMs convert to a wider type and accumulate in
// fp32 (TransformerEngine's hybrid recipe: E4M3 for activations and weights, E5M2 for
// gradients).
//
// Note [FP8 rounding]: float -> fp8 rounds to nearest, ties to even (on the code's last mantissa
// bit), including into and out of the subnormal range (E4M3 subnormals are k x 2^-9, E5M2 k x
// 2^-16, k = 1..7 / 1..3). A finite value whose rounding exceeds the largest finite value
// overflows: with saturate (TransformerEngine's and cuBLASLt's "satfinite") it becomes +-max;
// without, NaN (E4M3FN, which has no infinity) or +-inf (E5M2). Infinite inputs likewise become
// +-max when saturating, else NaN / +-inf. NaN stays NaN with the input's sign: S.1111.111
// (E4M3FN) and S.11111.11 (E5M2), the codes torch writes. Every finite fp8 value converts to
// float exactly. Without saturation the codes equal torch's float -> float8 conversion
// (c10's fp8e4m3fn_from_fp32_value / fp8e5m2_from_fp32_value) for every float.
//
// Note [FP8 conversion code]: the conversions are branch-free integer code on the float's bits,
// inline here so that tensor copies (core/dtype.h's Float8 storage types) and the array loops
// inline them, and GCC vectorizes those loops (AVX2: variable shifts and blends). No floating
// point operation is involved: under -ftrapping-math (GCC's default) one would keep the loops
// scalar, since a conditionally used float operation may not be computed speculatively.
// kernels/common/fp8.cuh repeats the same steps for the GPU; tests/core/test_fp8.cpp checks these
// against a brute-force nearest-value search, tests/ops/cuda/test_copy_cuda.cpp the GPU's against
// these.
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace td {

enum class Fp8Format { E4M3FN, E5M2 };

// "e4m3fn" / "e5m2".
const char* fp8_format_name(Fp8Format f);
// The largest finite value: 448 (E4M3FN), 57344 (E5M2).
float fp8_max(Fp8Format f);

namespace fp8_detail {

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// A format with E exponent bits, M mantissa bits and exponent bias B (Note [FP8 conversion
// code]); kIsE5M2 selects the IEEE-like specials (infinities, several NaNs) over E4M3FN's single
// NaN per sign.
template <int E, int M, int B>
struct Layout {
  static_assert(M <= 3, "decode's leading-bit search covers up to 3 mantissa bits");
  static constexpr bool kIsE5M2 = E == 5;
  static constexpr int kMan = M;
  static constexpr int kBias = B;
  static constexpr uint32_t kMaxCode = kIsE5M2 ? 0x7B : 0x7E;       // 57344 / 448
  static constexpr uint32_t kOverflowCode = kIsE5M2 ? 0x7C : 0x7F;  // +inf / NaN
  static constexpr uint32_t kNanCode = 0x7F;
  // float bits of 2^(1 - B), the smallest normal fp8 magnitude
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 - B + 1) << 23;
  // float exponent bias minus fp8 exponent bias, in the code's exponent position
  static constexpr uint32_t kRebias = static_cast<uint32_t>(127 - B) << 23;
};

template <typename L>
inline uint8_t encode(float x, bool saturate) {
  constexpr int M = L::kMan, B = L::kBias;
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // Normal results: round the mantissa to M bits (ties to even) by integer addition; a carry
  // moves into the exponent, as it should.
  const uint32_t odd = (a >> (23 - M)) & 1u;
  const uint32_t normal = (a - L::kRebias + ((1u << (22 - M)) - 1u) + odd) >> (23 - M);
  // Subnormal results (and zero): x = m x 2^(e - 150) with m the significand and e the biased
  // exponent (1 for float subnormals), which in units of the smallest subnormal 2^(1 - B - M) is
  // m >> s, s = 151 - B - M - e, rounded to nearest even. Where this result is used s >= 24 - M;
  // s is clamped to [1, 31] so that every lane's shifts are defined (s >= 25 gives 0 either way:
  // m < 2^24).
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);
  int32_t s = (151 - B - M) - static_cast<int32_t>(e != 0 ? e : 1u);
  s = s < 1 ? 1 : (s > 31 ? 31 : s);
  const uint32_t sub = (m + (1u << (s - 1)) - 1u + ((m >> s) & 1u)) >> s;
  uint32_t code = a < L::kMinNormalBits ? sub : normal;
  const uint32_t overflow = saturate ? L::kMaxCode : L::kOverflowCode;
  code = (a >= 0x7F800000u) | (code > L::kMaxCode) ? overflow : code;  // +-inf, or beyond max
  code = a > 0x7F800000u ? L::kNanCode : code;
  return static_cast<uint8_t>(sign | code);
}

template <typename L>
inline float decode(uint8_t c) {
  constexpr uint32_t M = L::kMan, B = L::kBias;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80) << 24;
  const uint32_t em = c & 0x7Fu;
  const uint32_t normal = (em << (23 - M)) + L::kRebias;
  // Subnormal codes em = 1 .. 2^M - 1 are em x 2^(1 - B - M); p is the position of em's leading
  // bit (M <= 3), which becomes the float's implicit bit.
  const uint32_t p = static_cast<uint32_t>(em >= 4) + static_cast<uint32_t>(em >= 2);
  const uint32_t sub = em == 0 ? 0u : ((p + 128 - B - M) << 23) | ((em << (23 - p)) & 0x7FFFFFu);
  uint32_t r = em < (1u << M) ? sub : normal;
  if constexpr (L::kIsE5M2) {
    const uint32_t special = em == 0x7Cu ? 0x7F800000u : 0x7FC00000u;  // inf, NaN
    r = em >= 0x7Cu ? special : r;
  } else {
    r = em == 0x7Fu ? 0x7FC00000u : r;
  }
  return float_of(sign | r);
}

using E4M3FN = Layout<4, 3, 7>;
using E5M2 = Layout<5, 2, 15>;

}  // namespace fp8_detail

// One value each way (Note [FP8 rounding]).
inline uint8_t fp8_from_float(float x, Fp8Format f, bool saturate = true) {
  return f == Fp8Format::E4M3FN ? fp8_detail::encode<fp8_detail::E4M3FN>(x, saturate)
                                : fp8_detail::encode<fp8_detail::E5M2>(x, saturate);
}
inline float fp8_to_float(uint8_t code, Fp8Format f) {
  return f == Fp8Format::E4M3FN ? fp8_detail::decode<fp8_detail::E4M3FN>(code)
                                : fp8_detail::decode<fp8_detail::E5M2>(code);
}

// Arrays of n values (vectorized, parallel over large arrays).
void fp8_from_float(const float* x, uint8_t* out, size_t n, Fp8Format f, bool saturate = true);
void fp8_to_float(const uint8_t* codes, float* out, size_t n, Fp8Format f);

// Note [FP8 storage types]: the element types of float8 tensors (DType::Float8E4M3FN /
// Float8E5M2), as td::BFloat16 is bf16's. Converting from float rounds to nearest even WITHOUT
// saturation (NaN / inf beyond the range), like torch's float8 types and like float -> float16
// here: this is what Tensor::to, copy_ and fill_ do. Saturation is a choice of the caller that
// scales values into range first (FP8 training): td::to_fp8(x, dtype, /*saturate=*/true).
struct Float8E4M3FN {
  uint8_t bits = 0;
  Float8E4M3FN() = default;
  Float8E4M3FN(float f)  // NOLINT: implicit like a float type
      : bits(fp8_detail::encode<fp8_detail::E4M3FN>(f, /*saturate=*/false)) {}
  operator float() const { return fp8_detail::decode<fp8_detail::E4M3FN>(bits); }
};

struct Float8E5M2 {
  uint8_t bits = 0;
  Float8E5M2() = default;
  Float8E5M2(float f)  // NOLINT
      : bits(fp8_detail::encode<fp8_detail::E5M2>(f, /*saturate=*/false)) {}
  operator float() const { return fp8_detail::decode<fp8_detail::E5M2>(bits); }
};

static_assert(sizeof(Float8E4M3FN) == 1 && sizeof(Float8E5M2) == 1);

}  // namespace td
