#pragma once
// Shapes, strides and the broadcasting rules shared by every op.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace td {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& sizes);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

// Wraps a possibly negative dim into [0, ndim); `op` names the caller in the error.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// numpy/torch broadcasting of two shapes; a mismatch is a td::Error naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Strides that make a tensor of `sizes`/`strides` appear with shape `target` (stride 0 on
// broadcast dims). Requires sizes to broadcast to target.
Shape broadcast_strides(const Shape& sizes, const Shape& strides, const Shape& target);

}  // namespace td
