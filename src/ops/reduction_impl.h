#pragma once
// Reduction plumbing shared by sum/mean/max/... (internal header).
#include <algorithm>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/ops/view.h"

namespace td::ops {

struct ReducePlan {
  Shape dims;      // sorted, unique, wrapped
  Shape out_keep;  // output shape with keepdim=true
  Shape out;       // output shape as requested
  int64_t count;   // elements reduced into each output
};

inline ReducePlan plan_reduce(const Tensor& x, const Shape& dims_in, bool keepdim, const char* op) {
  ReducePlan p;
  int64_t nd = x.dim();
  if (dims_in.empty()) {
    for (int64_t i = 0; i < nd; ++i) p.dims.push_back(i);
  } else {
    for (int64_t d : dims_in) p.dims.push_back(wrap_dim(d, nd, op));
  }
  std::sort(p.dims.begin(), p.dims.end());
  TD_CHECK(std::adjacent_find(p.dims.begin(), p.dims.end()) == p.dims.end(), op, ": dim ",
           "repeated in ", shape_str(dims_in));
  if (nd == 0) p.dims.clear();
  p.count = 1;
  for (int64_t i = 0; i < nd; ++i) {
    bool red = std::binary_search(p.dims.begin(), p.dims.end(), i);
    p.out_keep.push_back(red ? 1 : x.size(i));
    if (red) {
      p.count *= x.size(i);
      if (keepdim) p.out.push_back(1);
    } else {
      p.out.push_back(x.size(i));
    }
  }
  return p;
}

// Lays x out so each output element owns one contiguous row of `count` inputs: returns the
// [outer, count] contiguous tensor (a permuted copy only when the reduced dims are not already
// the innermost ones).
inline Tensor rows_layout(const Tensor& x, const ReducePlan& p) {
  Shape perm;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (!std::binary_search(p.dims.begin(), p.dims.end(), i)) perm.push_back(i);
  }
  for (int64_t d : p.dims) perm.push_back(d);
  Tensor xp = permute(x.detach(), perm).contiguous();
  return xp.view({numel_of(p.out_keep), p.count});
}

// True if the reduced dims are exactly the leading dims and x is contiguous: then
// out[j] = reduce_i x[i, j] over an [count, inner] matrix without any copy.
inline bool is_leading_reduce(const Tensor& x, const ReducePlan& p) {
  if (!x.is_contiguous() || p.dims.empty()) return false;
  for (size_t i = 0; i < p.dims.size(); ++i) {
    if (p.dims[i] != static_cast<int64_t>(i)) return false;
  }
  return static_cast<int64_t>(p.dims.size()) < x.dim();
}

}  // namespace td::ops
