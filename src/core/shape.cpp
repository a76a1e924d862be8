#include "tardelli/core/shape.h"

#include <sstream>

#include "tardelli/core/error.h"

namespace td {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& sizes) {
  Shape st(sizes.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return st;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = std::max<int64_t>(ndim, 1);  // a 0-dim tensor accepts dim 0 and -1
  TD_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " out of range for a tensor with ", ndim,
           " dims (expected in [", -n, ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TD_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Shape& sizes, const Shape& strides, const Shape& target) {
  TD_CHECK(sizes.size() <= target.size(), "broadcast: cannot broadcast ", shape_str(sizes), " to ",
           shape_str(target));
  Shape out(target.size(), 0);
  size_t lead = target.size() - sizes.size();
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t s = sizes[i], t = target[lead + i];
    TD_CHECK(s == t || s == 1, "broadcast: cannot broadcast ", shape_str(sizes), " to ",
             shape_str(target));
    out[lead + i] = (s == t && s != 1) ? strides[i] : 0;
  }
  return out;
}

}  // namespace td
