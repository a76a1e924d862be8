#include "tardelli/ops/copy.h"

#include <cstring>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/factory.h"

namespace td {

void copy_into(const Tensor& dst, const Tensor& src) {
  TD_CHECK(dst.defined() && src.defined(), "copy_: undefined tensor");
  ops::check_cpu(dst, "copy_");
  ops::check_cpu(src, "copy_");
  broadcast_shapes(dst.sizes(), src.sizes(), "copy_");  // validates
  TD_CHECK(broadcast_shapes(dst.sizes(), src.sizes(), "copy_") == dst.sizes(), "copy_: source ",
           shape_str(src.sizes()), " cannot be broadcast to destination ", shape_str(dst.sizes()));
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.sizes() == src.sizes()) {
    if (dst.data_ptr() != src.data_ptr()) {
      const char* s = static_cast<const char*>(src.data_ptr());
      char* d = static_cast<char*>(dst.data_ptr());
      int64_t nb = static_cast<int64_t>(dst.nbytes());
      cpu::parallel_for(nb, 1 << 20, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, e - b); });
    }
    return;
  }
  TD_DISPATCH_ALL(dst.dtype(), "copy_", [&]<typename TD>() {
    TD_DISPATCH_ALL(src.dtype(), "copy_", [&]<typename TS>() {
      cpu::map<TD, TS>(dst, [](acc_t<TS> v) { return static_cast<acc_t<TD>>(v); }, {src});
    });
  });
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  TD_CHECK(t.defined(), "to: undefined tensor");
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.sizes(), dtype, t.device());
  copy_into(out, t);
  if (is_floating(dtype) && autograd::needs_grad({t})) {
    autograd::record("ToCopyBackward", {t}, {&out}, [src = t.dtype()](const TensorList& g,
                                                                     const auto&) {
      return TensorList{to_dtype(g[0], src)};
    });
  }
  return out;
}

Tensor clone(const Tensor& t) {
  TD_CHECK(t.defined(), "clone: undefined tensor");
  Tensor out = Tensor::empty(t.sizes(), t.dtype(), t.device());
  copy_into(out, t);
  if (autograd::needs_grad({t})) {
    autograd::record("CloneBackward", {t}, {&out}, [](const TensorList& g, const auto&) {
      return TensorList{g[0]};
    });
  }
  return out;
}

}  // namespace td
