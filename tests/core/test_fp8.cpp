// FP8 formats (core/fp8.h) against the OCP FP8 specification v1.0 and a brute-force reference.
//
// Properties: every code decodes to the spec's value and re-encodes to itself (NaNs to the
// canonical NaN); float -> fp8 rounds to the nearest representable value with ties to the even
// code, found here by scanning all 256 codes (Note [FP8 rounding]); overflow saturates or gives
// NaN / inf; the array conversions equal the scalar ones; the branch-free conversion (Note [FP8
// conversion code]) equals an independent arithmetic reference on millions of floats chosen
// around every rounding boundary. All comparisons are exact.
#include "tardelli/core/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using td::Fp8Format;

// The nearest finite code to x by brute force (ties: the even code), or -1 when x is beyond
// the largest finite value's rounding range.
int nearest_code(double x, Fp8Format f) {
  int best = -1;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    const double v = td::fp8_to_float(static_cast<uint8_t>(c), f);
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
    const double d = std::fabs(v - x);
    if (d < best_d || (d == best_d && (c & 1) == 0 && best >= 0 && (best & 1) == 1)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

TEST(Fp8, SpecValues) {
  const Fp8Format e4 = Fp8Format::E4M3FN, e5 = Fp8Format::E5M2;
  EXPECT_EQ(td::fp8_max(e4), 448.0f);
  EXPECT_EQ(td::fp8_max(e5), 57344.0f);
  EXPECT_EQ(td::fp8_to_float(0x7E, e4), 448.0f);
  EXPECT_EQ(td::fp8_to_float(0x08, e4), std::ldexp(1.0f, -6));           // min normal
  EXPECT_EQ(td::fp8_to_float(0x07, e4), 0.875f * std::ldexp(1.0f, -6));  // max subnormal
  EXPECT_EQ(td::fp8_to_float(0x01, e4), std::ldexp(1.0f, -9));           // min subnormal
  EXPECT_TRUE(std::isnan(td::fp8_to_float(0x7F, e4)));
  EXPECT_TRUE(std::isnan(td::fp8_to_float(0xFF, e4)));
  EXPECT_EQ(td::fp8_to_float(0xFE, e4), -448.0f);
  EXPECT_EQ(td::fp8_to_float(0x78, e4), 256.0f);  // S.1111.000: a number in E4M3FN
  EXPECT_EQ(td::fp8_to_float(0x7B, e5), 57344.0f);
  EXPECT_EQ(td::fp8_to_float(0x7C, e5), std::numeric_limits<float>::infinity());
  EXPECT_EQ(td::fp8_to_float(0xFC, e5), -std::numeric_limits<float>::infinity());
  for (uint8_t c : {0x7D, 0x7E, 0x7F}) EXPECT_TRUE(std::isnan(td::fp8_to_float(c, e5)));
  EXPECT_EQ(td::fp8_to_float(0x04, e5), std::ldexp(1.0f, -14));  // min normal
  EXPECT_EQ(td::fp8_to_float(0x01, e5), std::ldexp(1.0f, -16));  // min subnormal
  EXPECT_EQ(td::fp8_to_float(0x80, e4), -0.0f);
  EXPECT_TRUE(std::signbit(td::fp8_to_float(0x80, e5)));
}

TEST(Fp8, EveryCodeRoundTrips) {
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    for (int c = 0; c < 256; ++c) {
      const float v = td::fp8_to_float(static_cast<uint8_t>(c), f);
      const uint8_t back = td::fp8_from_float(v, f, /*saturate=*/false);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(td::fp8_to_float(back, f))) << td::fp8_format_name(f) << " " << c;
        EXPECT_EQ(back & 0x80, c & 0x80);
      } else {
        EXPECT_EQ(back, c) << td::fp8_format_name(f) << " code " << c << " = " << v;
      }
    }
  }
}

TEST(Fp8, RoundingTiesOverflowAndSubnormals) {
  const Fp8Format e4 = Fp8Format::E4M3FN, e5 = Fp8Format::E5M2;
  EXPECT_EQ(td::fp8_from_float(449.0f, e4), 0x7E);        // rounds down to 448
  EXPECT_EQ(td::fp8_from_float(464.0f, e4), 0x7E);        // tie 448 (mant 110) / 480: even
  EXPECT_EQ(td::fp8_from_float(465.0f, e4, true), 0x7E);  // rounds to 480: saturates
  EXPECT_TRUE(std::isnan(td::fp8_to_float(td::fp8_from_float(465.0f, e4, false), e4)));
  EXPECT_EQ(td::fp8_from_float(1e30f, e4, true), 0x7E);
  EXPECT_EQ(td::fp8_from_float(-INFINITY, e4, true), 0xFE);
  EXPECT_EQ(td::fp8_from_float(std::ldexp(1.0f, -10), e4), 0x00);      // half the min subnormal
  EXPECT_EQ(td::fp8_from_float(3 * std::ldexp(1.0f, -11), e4), 0x01);  // 0.75 of it
  EXPECT_EQ(td::fp8_from_float(-std::ldexp(1.0f, -12), e4), 0x80);     // -0
  EXPECT_EQ(td::fp8_from_float(61440.0f, e5, true), 0x7B);   // tie 57344 / 65536: overflow
  EXPECT_EQ(td::fp8_from_float(61440.0f, e5, false), 0x7C);  // inf
  EXPECT_EQ(td::fp8_from_float(INFINITY, e5, false), 0x7C);
  EXPECT_EQ(td::fp8_from_float(60000.0f, e5, true), 0x7B);
  EXPECT_EQ(td::fp8_from_float(0.875f * std::ldexp(1.0f, -6) + std::ldexp(1.0f, -10), e4),
            0x08);  // the max subnormal plus half a step: tie, the even code (the min normal)
  EXPECT_TRUE(std::isnan(td::fp8_to_float(td::fp8_from_float(NAN, e5), e5)));
}

TEST(Fp8, MatchesBruteForceNearest) {
  std::mt19937 rng(5);
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    const double max = td::fp8_max(f);
    std::vector<float> xs;
    // Random magnitudes over every binade, and every midpoint between neighbouring codes.
    std::uniform_real_distribution<double> logu(-20.0, std::log2(max) + 0.05);
    for (int i = 0; i < 20000; ++i) {
      const double v = std::exp2(logu(rng)) * ((rng() & 1) ? 1 : -1);
      xs.push_back(static_cast<float>(v));
    }
    for (int c = 0; c < 127; ++c) {
      const double a = td::fp8_to_float(static_cast<uint8_t>(c), f);
      const double b = td::fp8_to_float(static_cast<uint8_t>(c + 1), f);
      if (std::isfinite(a) && std::isfinite(b)) xs.push_back(static_cast<float>((a + b) / 2));
    }
    std::vector<uint8_t> arr(xs.size());
    td::fp8_from_float(xs.data(), arr.data(), xs.size(), f, /*saturate=*/true);
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint8_t got = td::fp8_from_float(xs[i], f, true);
      ASSERT_EQ(arr[i], got) << "array vs scalar at " << xs[i];
      const int want = nearest_code(xs[i], f);
      const bool beyond = std::fabs(xs[i]) > max;
      if (want < 0 || beyond) continue;  // overflow: covered by the test above
      ASSERT_EQ(got & 0x7F, want & 0x7F)
          << td::fp8_format_name(f) << ": " << xs[i] << " -> " << td::fp8_to_float(got, f)
          << ", nearest " << td::fp8_to_float(static_cast<uint8_t>(want), f);
    }
    std::vector<float> back(arr.size());
    td::fp8_to_float(arr.data(), back.data(), arr.size(), f);
    for (size_t i = 0; i < arr.size(); ++i) ASSERT_EQ(back[i], td::fp8_to_float(arr[i], f));
  }
}

// An independent reference by arithmetic in double (the library's first implementation):
// scale into the value's binade, round with nearbyint (ties to even), rebuild the code.
uint8_t reference_encode(float x, Fp8Format f, bool saturate) {
  const bool e5 = f == Fp8Format::E5M2;
  const int man_bits = e5 ? 2 : 3, bias = e5 ? 15 : 7;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const double max = e5 ? 57344.0 : 448.0;
  const uint8_t max_code = e5 ? 0x7B : 0x7E, overflow_code = e5 ? 0x7C : 0x7F;
  if (std::isinf(x)) return sign | (saturate ? max_code : overflow_code);
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0.0) return sign;
  const int emin = 1 - bias;
  int e;
  std::frexp(a, &e);
  const int binade = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, binade - man_bits);
  const double n = std::nearbyint(a / quantum);
  const double r = n * quantum;
  if (r > max) return sign | (saturate ? max_code : overflow_code);
  if (r < std::ldexp(1.0, emin)) return sign | static_cast<uint8_t>(n);
  int re;
  const double frac = std::frexp(r, &re);
  const int man = static_cast<int>(std::ldexp(frac * 2.0 - 1.0, man_bits));
  return sign | static_cast<uint8_t>(((re - 1 + bias) << man_bits) | man);
}

// Property: the conversion equals the reference for every float whose top 19 bits (sign,
// exponent, 10 mantissa bits: every rounding position of both formats, subnormal results
// included) take every value and whose low 13 bits take the patterns that decide rounding
// (exact, just above, just below and at the half-way point of the positions below them), in both
// modes; and the array conversion equals the scalar one. (Checked once for all 2^32 floats while
// writing the conversion: no difference.)
TEST(Fp8, MatchesReferenceAroundEveryRoundingBoundary) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF};
  std::vector<float> xs;
  xs.reserve((size_t{1} << 19) * 6);
  for (uint32_t hi = 0; hi < (1u << 19); ++hi) {
    for (uint32_t lo : lows) {
      const uint32_t u = (hi << 13) | lo;
      float x;
      std::memcpy(&x, &u, 4);
      xs.push_back(x);
    }
  }
  std::vector<uint8_t> arr(xs.size());
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    for (bool sat : {false, true}) {
      td::fp8_from_float(xs.data(), arr.data(), xs.size(), f, sat);
      size_t bad = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const uint8_t want = reference_encode(xs[i], f, sat);
        const uint8_t got = td::fp8_from_float(xs[i], f, sat);
        if (got != want || arr[i] != want) {
          if (++bad <= 5)
            ADD_FAILURE() << td::fp8_format_name(f) << " saturate=" << sat << " x=" << xs[i]
                          << ": got " << int(got) << " (array " << int(arr[i]) << "), want "
                          << int(want);
        }
      }
      EXPECT_EQ(bad, 0u) << td::fp8_format_name(f) << " saturate=" << sat;
    }
  }
}

// Property: NaN becomes S.1111.111 (e4m3fn) / S.11111.11 (e5m2) keeping its sign, the codes
// torch writes; every NaN code decodes to a NaN of its sign.
TEST(Fp8, NanCodes) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    for (bool sat : {false, true}) {
      EXPECT_EQ(td::fp8_from_float(qnan, f, sat), 0x7F);
      EXPECT_EQ(td::fp8_from_float(-qnan, f, sat), 0xFF);
    }
  }
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) {
    const float v = td::fp8_to_float(static_cast<uint8_t>(c), Fp8Format::E5M2);
    EXPECT_TRUE(std::isnan(v));
    EXPECT_EQ(std::signbit(v), c >= 0x80);
  }
  const float n = td::fp8_to_float(0xFF, Fp8Format::E4M3FN);
  EXPECT_TRUE(std::isnan(n) && std::signbit(n));
}

// Property: the tensor element types convert as fp8_from_float without saturation (Note [FP8
// storage types]) and back as fp8_to_float.
TEST(Fp8, StorageTypesDoNotSaturate) {
  EXPECT_EQ(td::Float8E4M3FN(1.0f).bits, 0x38);
  EXPECT_EQ(td::Float8E4M3FN(-448.0f).bits, 0xFE);
  EXPECT_EQ(td::Float8E4M3FN(500.0f).bits, 0x7F);  // NaN: e4m3fn has no infinity
  EXPECT_EQ(td::Float8E5M2(1.0f).bits, 0x3C);
  EXPECT_EQ(td::Float8E5M2(-1e6f).bits, 0xFC);  // -inf
  td::Float8E5M2 h;
  h.bits = 0x7B;
  EXPECT_EQ(static_cast<float>(h), 57344.0f);
  td::Float8E4M3FN q;
  q.bits = 0x01;
  EXPECT_EQ(static_cast<float>(q), std::ldexp(1.0f, -9));
}

}  // namespace
