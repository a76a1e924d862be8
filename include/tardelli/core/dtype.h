#pragma once
#include <cstdint>
#include <string>

#include "tardelli/core/error.h"
#include "tardelli/core/fp8.h"
#include "tardelli/core/half.h"

namespace td {

// The FP8 formats come last so that the other values keep their numbers (kernels/ mirrors the
// order in its element-type lists).
enum class DType : uint8_t {
  Float32,
  BFloat16,
  Float16,
  Int32,
  Int64,
  Bool,
  Float8E4M3FN,
  Float8E5M2
};

inline constexpr int kNumDTypes = 8;

size_t itemsize(DType t);
// "float32", "bfloat16", ..., "float8_e4m3fn", "float8_e5m2" (torch's names).
const char* dtype_name(DType t);

// Note [FP8 dtypes]: float8_e4m3fn and float8_e5m2 tensors are storage. They convert to and
// from every dtype (Tensor::to, copy_, to_fp8), move (views, reshape, contiguous, cat,
// cross-device copies), fill, print, load and save; nothing computes in them, so every other op
// refuses them with its "unsupported dtype" error and promote_types refuses to mix them with
// anything, as torch does. Unlike torch, is_floating() (and Tensor::is_floating_point()) is
// false for them: that predicate is what admits a tensor to arithmetic, autograd (requires_grad,
// the backward of to()) and optimizers here, none of which take FP8. is_float8() names them.
inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::BFloat16 || t == DType::Float16;
}
inline bool is_float8(DType t) { return t == DType::Float8E4M3FN || t == DType::Float8E5M2; }
inline bool is_reduced_float(DType t) { return t == DType::BFloat16 || t == DType::Float16; }
inline bool is_integral(DType t) { return t == DType::Int32 || t == DType::Int64; }
// The FP8 format of a float8 dtype (an error for any other dtype).
Fp8Format fp8_format_of(DType t);

// Type promotion for binary ops (torch's lattice restricted to our dtypes):
// bool < int32 < int64 < {bf16, f16} < f32; bf16 with f16 gives f32. A float8 dtype promotes
// only with itself; with any other dtype it is an error (torch: "Promotion for Float8 Types is
// not supported").
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
template <> struct dtype_of<Float8E4M3FN> { static constexpr DType value = DType::Float8E4M3FN; };
template <> struct dtype_of<Float8E5M2> { static constexpr DType value = DType::Float8E5M2; };

// The type arithmetic on T is carried out in: float for all floating types (and the value a
// float8 element converts to).
template <typename T> struct acc_type { using type = T; };
template <> struct acc_type<BFloat16> { using type = float; };
template <> struct acc_type<Float16> { using type = float; };
template <> struct acc_type<Float8E4M3FN> { using type = float; };
template <> struct acc_type<Float8E5M2> { using type = float; };
template <typename T> using acc_t = typename acc_type<T>::type;

}  // namespace td

// Typed dispatch on a runtime dtype. The body is a generic lambda taking a type parameter:
//   TD_DISPATCH_FLOATING(t.dtype(), "gelu", [&]<typename T>() { kernel<T>(...); });
// An unsupported dtype is a td::Error naming the op. No function pointers are cast, so a wrong
// argument list fails to compile. (Variadic so the lambda may contain commas.) Only
// TD_DISPATCH_ALL_AND_FLOAT8 reaches the float8 storage types (Note [FP8 dtypes]): ops that
// convert or move elements (copy_, fill_, item, printing) use it.
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
      case ::td::DType::Float8E4M3FN:                                            \
      case ::td::DType::Float8E5M2:                                              \
        TD_ERROR(opname, ": unsupported dtype ", ::td::dtype_name(dtype),        \
                 " (float8 tensors only convert and move: use .to() first)");    \
    }                                                                            \
    TD_ERROR(opname, ": invalid dtype");                                         \
  }()

#define TD_DISPATCH_ALL_AND_FLOAT8(dtype, opname, ...)                           \
  [&]() {                                                                        \
    auto&& td_dispatch_f_ = __VA_ARGS__;                                         \
    switch (dtype) {                                                             \
      TD_DISPATCH_CASE_(Float32, float)                                          \
      TD_DISPATCH_CASE_(BFloat16, ::td::BFloat16)                                \
      TD_DISPATCH_CASE_(Float16, ::td::Float16)                                  \
      TD_DISPATCH_CASE_(Int32, int32_t)                                          \
      TD_DISPATCH_CASE_(Int64, int64_t)                                          \
      TD_DISPATCH_CASE_(Bool, bool)                                              \
      TD_DISPATCH_CASE_(Float8E4M3FN, ::td::Float8E4M3FN)                        \
      TD_DISPATCH_CASE_(Float8E5M2, ::td::Float8E5M2)                            \
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
