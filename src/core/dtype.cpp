#include "tardelli/core/dtype.h"

#include <ostream>

namespace td {

size_t itemsize(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::Float8E4M3FN: return 1;
    case DType::Float8E5M2: return 1;
  }
  TD_ERROR("itemsize: invalid dtype ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::Float8E4M3FN: return "float8_e4m3fn";
    case DType::Float8E5M2: return "float8_e5m2";
  }
  return "invalid";
}

Fp8Format fp8_format_of(DType t) {
  TD_CHECK(is_float8(t), "fp8_format_of: ", dtype_name(t), " is not a float8 dtype");
  return t == DType::Float8E4M3FN ? Fp8Format::E4M3FN : Fp8Format::E5M2;
}

static int rank_of(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::Int32: return 1;
    case DType::Int64: return 2;
    case DType::BFloat16: return 3;
    case DType::Float16: return 3;
    case DType::Float32: return 4;
    case DType::Float8E4M3FN:
    case DType::Float8E5M2: break;  // Note [FP8 dtypes]: no promotion
  }
  return -1;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  TD_CHECK(!is_float8(a) && !is_float8(b), "promote_types: promotion between ", dtype_name(a),
           " and ", dtype_name(b),
           " is not supported (float8 tensors take part in no arithmetic: convert them with "
           ".to() first)");
  if (is_reduced_float(a) && is_reduced_float(b)) return DType::Float32;
  return rank_of(a) >= rank_of(b) ? a : b;
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace td
