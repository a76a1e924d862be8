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
// +-max when saturating, else NaN / +-inf. NaN stays NaN (the canonical code with the input's
// sign). Every finite fp8 value converts to float exactly.
#include <cstddef>
#include <cstdint>

namespace td {

enum class Fp8Format { E4M3FN, E5M2 };

// "e4m3fn" / "e5m2".
const char* fp8_format_name(Fp8Format f);
// The largest finite value: 448 (E4M3FN), 57344 (E5M2).
float fp8_max(Fp8Format f);

// One value each way (Note [FP8 rounding]).
uint8_t fp8_from_float(float x, Fp8Format f, bool saturate = true);
float fp8_to_float(uint8_t code, Fp8Format f);

// Arrays of n values (parallel over the array; decoding through a 256-entry table).
void fp8_from_float(const float* x, uint8_t* out, size_t n, Fp8Format f, bool saturate = true);
void fp8_to_float(const uint8_t* codes, float* out, size_t n, Fp8Format f);

}  // namespace td
