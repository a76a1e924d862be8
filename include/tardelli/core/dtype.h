#pragma once
#include <cstdint>
#include <string>

#include "tardelli/core/error.h"
#include "tardelli/core/half.h"

namespace td {

enum class DType : uint8_t { Float32, BFloat16, Float16, Int32, Int64, Bool };

inline constexpr int kNumDTypes = 6;

size_t itemsize(DType t);
const char* dtype_name(DType t);  // "float32", "bfloat16", ... (torch's names)
inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::BFloat16 || t == DType::Float16;
}
inline bool is_reduced_float(DType t) { return t == DType::BFloat16 || t == DType::Float16; }
inline bool is_integral(DType t) { return t == DType::Int32 || t == DType::Int64; }

// Type promotion for binary ops (torch's lattice restricted to our dtypes):
// bool < int32 < int64 < {bf16, f16} < f32; bf16 with f16 gives f32.
DType promote_types(DType a, DType b);

std::ostream& operator<<(std::ostream& os, DType t);

// C++ type <-> DType
template <typename T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct dtype_of<Float16> { static constexpr DType value = DType::Float16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };

// The type arithmetic on T is carried out in: float for all floating types.
template <typename T> struct acc_type { using type = T; };
template <> struct acc_type<BFloat16> { using type = float; };
template <> struct acc_type<Float16> { using type = float; };
template <typename T> using acc_t = typename acc_type<T>::type;

}  // namespace td

// Typed dispatch on a runtime dtype. The body is a generic lambda taking a type parameter:
//   TD_DISPATCH_FLOATING(t.dtype(), "gelu", [&]<typename T>() { kernel<T>(...); });
// An unsupported dtype is a td::Error naming the op. No function pointers are cast, so a wrong
// argument list fails to compile. (Variadic so the lambda may contain commas.)
#define TD_DISPATCH_CASE_(DT, CT) \
  case ::td::DType::DT:           \
    return td_dispatch_f_.template operator()<CT>();

#define TD_DISPATCH_FLOATING(dtype, opname, ...)                                 \
  [&]() {                                                                        \
    auto&& td_dispatch_f_ = __VA_ARGS__;                                         \
    switch (dtype) {                                                             \
      TD_DISPATCH_CASE_(Float32, float)                                          \
      TD_DISPATCH_CASE_(BFloat16, ::td::BFloat16)                                \
      TD_DISPATCH_CASE_(Float16, ::td::Float16)                                  \
      default:                                                                   \
        TD_ERROR(opname, ": unsupported dtype ", ::td::dtype_name(dtype),        \
                 " (expected a floating dtype: float32, bfloat16 or float16)");  \
    }                                                                            \
  }()

#define TD_DISPATCH_NUMERIC(dtype, opname, ...)                                  \
  [&]() {                                                                        \
    auto&& td_dispatch_f_ = __VA_ARGS__;                                         \
    switch (dtype) {                                                             \
      TD_DISPATCH_CASE_(Float32, float)                                          \
      TD_DISPATCH_CASE_(BFloat16, ::td::BFloat16)                                \
      TD_DISPATCH_CASE_(Float16, ::td::Float16)                                  \
      TD_DISPATCH_CASE_(Int32, int32_t)                                          \
      TD_DISPATCH_CASE_(Int64, int64_t)                                          \
      default:                                                                   \
        TD_ERROR(opname, ": unsupported dtype ", ::td::dtype_name(dtype));       \
    }                                                                            \
  }()

#define TD_DISPATCH_ALL(dtype, opname, ...)                                      \
  [&]() {                                                                        \
    auto&& td_dispatch_f_ = __VA_ARGS__;                                         \
    switch (dtype) {                                                             \
      TD_DISPATCH_CASE_(Float32, float)                                          \
      TD_DISPATCH_CASE_(BFloat16, ::td::BFloat16)                                \
      TD_DISPATCH_CASE_(Float16, ::td::Float16)                                  \
      TD_DISPATCH_CASE_(Int32, int32_t)                                          \
      TD_DISPATCH_CASE_(Int64, int64_t)                                          \
      TD_DISPATCH_CASE_(Bool, bool)                                              \
    }                                                                            \
    TD_ERROR(opname, ": invalid dtype");                                         \
  }()

#define TD_DISPATCH_INDEX(dtype, opname, ...)                                    \
  [&]() {                                                                        \
    auto&& td_dispatch_f_ = __VA_ARGS__;                                         \
    switch (dtype) {                                                             \
      TD_DISPATCH_CASE_(Int32, int32_t)                                          \
      TD_DISPATCH_CASE_(Int64, int64_t)                                          \
      default:                                                                   \
        TD_ERROR(opname, ": index tensor must be int32 or int64, got ",          \
                 ::td::dtype_name(dtype));                                       \
    }                                                                            \
  }()
