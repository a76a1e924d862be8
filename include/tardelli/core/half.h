#pragma once
// 16-bit floating point storage types. Arithmetic is never done in these types: kernels load
// them, convert to float, compute and round back (round-to-nearest-even), so bf16/f16 tensors
// get fp32 accumulation everywhere.
#include <cstdint>
#include <cstring>

namespace td {

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a float type
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return static_cast<uint16_t>(u >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  Float16(float f) : bits(from_float(f)) {}  // NOLINT
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    _Float16 h = static_cast<_Float16>(f);  // F16C / soft-float, round to nearest even
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
  }
  static float to_float(uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return static_cast<float>(h);
  }
};

static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2);

}  // namespace td
