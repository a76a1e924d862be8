#include "tardelli/core/fp8.h"

#include <array>
#include <cmath>
#include <limits>

namespace td {

namespace {

struct Layout {
  int exp_bits, man_bits, bias;
  bool has_inf;  // E5M2: IEEE-like top exponent; E4M3FN: only S.1111.111 is NaN
};

constexpr Layout layout(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? Layout{4, 3, 7, false} : Layout{5, 2, 15, true};
}

constexpr uint8_t nan_code(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? 0x7F : 0x7E;  // E5M2: a quiet NaN (S.11111.10)
}

constexpr uint8_t max_code(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? 0x7E : 0x7B;  // 448 = 1.75 x 2^8; 57344 = 1.75 x 2^15
}

double decode(uint8_t code, Fp8Format f) {
  const Layout L = layout(f);
  const int e = (code >> L.man_bits) & ((1 << L.exp_bits) - 1);
  const int m = code & ((1 << L.man_bits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int top = (1 << L.exp_bits) - 1;
  if (L.has_inf && e == top) {
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::copysign(std::numeric_limits<double>::quiet_NaN(), sign);
  }
  if (!L.has_inf && e == top && m == (1 << L.man_bits) - 1)
    return std::copysign(std::numeric_limits<double>::quiet_NaN(), sign);
  if (e == 0) return sign * std::ldexp(m, 1 - L.bias - L.man_bits);  // subnormal
  return sign * std::ldexp((1 << L.man_bits) + m, e - L.bias - L.man_bits);
}

const std::array<float, 256>& table(Fp8Format f) {
  static const auto make = [](Fp8Format g) {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = static_cast<float>(decode(static_cast<uint8_t>(c), g));
    return t;
  };
  static const std::array<float, 256> e4 = make(Fp8Format::E4M3FN), e5 = make(Fp8Format::E5M2);
  return f == Fp8Format::E4M3FN ? e4 : e5;
}

}  // namespace

const char* fp8_format_name(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? "e4m3fn" : "e5m2";
}

float fp8_max(Fp8Format f) {
  return static_cast<float>(decode(max_code(f), f));
}

// Note [FP8 rounding].
uint8_t fp8_from_float(float x, Fp8Format f, bool saturate) {
  const Layout L = layout(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | nan_code(f);
  const double max = decode(max_code(f), f);
  const auto overflow = [&]() -> uint8_t {
    if (saturate) return sign | max_code(f);
    return L.has_inf ? static_cast<uint8_t>(sign | 0x7C) : static_cast<uint8_t>(sign | 0x7F);
  };
  if (std::isinf(x)) return overflow();
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0.0) return sign;
  const int emin = 1 - L.bias;  // the smallest normal exponent
  int e;
  std::frexp(a, &e);  // a = frac x 2^e, frac in [0.5, 1): the binade's exponent is e - 1
  const int binade = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, binade - L.man_bits);
  const double n = std::nearbyint(a / quantum);  // ties to even (default rounding mode)
  const double r = n * quantum;                  // may carry into the next binade
  if (r > max) return overflow();
  if (r == 0.0) return sign;
  if (r < std::ldexp(1.0, emin)) {  // subnormal: k x 2^(emin - M)
    return sign | static_cast<uint8_t>(n);
  }
  int re;
  const double frac = std::frexp(r, &re);  // r = frac x 2^re
  const int exp_field = re - 1 + L.bias;
  const int man = static_cast<int>(std::ldexp(frac * 2.0 - 1.0, L.man_bits));
  return sign | static_cast<uint8_t>((exp_field << L.man_bits) | man);
}

float fp8_to_float(uint8_t code, Fp8Format f) {
  return table(f)[code];
}

void fp8_from_float(const float* x, uint8_t* out, size_t n, Fp8Format f, bool saturate) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (size_t i = 0; i < n; ++i) out[i] = fp8_from_float(x[i], f, saturate);
}

void fp8_to_float(const uint8_t* codes, float* out, size_t n, Fp8Format f) {
  const auto& t = table(f);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (size_t i = 0; i < n; ++i) out[i] = t[codes[i]];
}

}  // namespace td
