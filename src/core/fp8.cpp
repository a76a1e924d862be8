#include "tardelli/core/fp8.h"

#include <omp.h>

namespace td {

namespace {

// Note [FP8 conversion code]: each loop below is one format and one saturation mode, so the
// inlined conversion has no data-dependent branch and GCC vectorizes it; large arrays are split
// across OpenMP threads as the tensor copy loops are.
constexpr size_t kParallelGrain = size_t{1} << 16;

template <typename L, bool Saturate>
void encode_array(const float* x, uint8_t* out, size_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (size_t i = 0; i < n; ++i) out[i] = fp8_detail::encode<L>(x[i], Saturate);
}

template <typename L>
void decode_array(const uint8_t* codes, float* out, size_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (size_t i = 0; i < n; ++i) out[i] = fp8_detail::decode<L>(codes[i]);
}

}  // namespace

const char* fp8_format_name(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? "e4m3fn" : "e5m2";
}

float fp8_max(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? 448.0f : 57344.0f;
}

void fp8_from_float(const float* x, uint8_t* out, size_t n, Fp8Format f, bool saturate) {
  using fp8_detail::E4M3FN;
  using fp8_detail::E5M2;
  if (f == Fp8Format::E4M3FN) {
    saturate ? encode_array<E4M3FN, true>(x, out, n) : encode_array<E4M3FN, false>(x, out, n);
  } else {
    saturate ? encode_array<E5M2, true>(x, out, n) : encode_array<E5M2, false>(x, out, n);
  }
}

void fp8_to_float(const uint8_t* codes, float* out, size_t n, Fp8Format f) {
  if (f == Fp8Format::E4M3FN) {
    decode_array<fp8_detail::E4M3FN>(codes, out, n);
  } else {
    decode_array<fp8_detail::E5M2>(codes, out, n);
  }
}

}  // namespace td
