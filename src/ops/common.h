#pragma once
// Argument checks shared by the op front-ends (internal header). Every message names the op.
#include "tardelli/core/tensor.h"

namespace td::ops {

inline void check_defined(const Tensor& t, const char* op, const char* arg) {
  TD_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

// The CPU backend runs every op; CUDA tensors need the CUDA backend (TD_WITH_CUDA).
inline void check_cpu(const Tensor& t, const char* op) {
  TD_CHECK(t.is_cpu(), op, ": tensor on ", t.device().str(),
           " but this op has only a CPU implementation in this build");
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  TD_CHECK(a.device() == b.device(), op, ": expected all tensors on the same device, got ",
           a.device().str(), " and ", b.device().str());
}

// Note [FP8 dtypes]: for the paths that would otherwise widen a non-floating input to float32
// (int tensors do), so that float8 tensors get the same refusal everywhere.
inline void check_not_float8(const Tensor& t, const char* op) {
  TD_CHECK(!is_float8(t.dtype()), op, ": unsupported dtype ", dtype_name(t.dtype()),
           " (float8 tensors only convert and move: use .to() first)");
}

inline void check_floating(const Tensor& t, const char* op) {
  TD_CHECK(t.is_floating_point(), op, ": expected a floating point tensor, got ", describe(t));
}

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  TD_CHECK(a.dtype() == b.dtype(), op, ": expected tensors of the same dtype, got ", describe(a),
           " and ", describe(b));
}

// The sizes of a tensor of shape s as [outer, s[dim], inner] (index_select, index_add).
struct Split3 {
  int64_t outer = 1, mid = 1, inner = 1;
};
inline Split3 split3(const Shape& s, int64_t dim) {
  Split3 r;
  for (int64_t i = 0; i < dim; ++i) r.outer *= s[i];
  r.mid = s[dim];
  for (size_t i = static_cast<size_t>(dim) + 1; i < s.size(); ++i) r.inner *= s[i];
  return r;
}

}  // namespace td::ops
