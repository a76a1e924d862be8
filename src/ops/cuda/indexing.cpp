#if TD_WITH_CUDA
#include "ops/cuda/indexing.h"

#include "indexing/indexing.cuh"
#include "ops/cuda/launch.h"

namespace td::cuda_ops {
namespace {

using ops::split3;
using ops::Split3;

// The index, contiguous, after the CPU backend's checks; its values are checked on the device
// (one small read-back) so a bad one is a td::Error naming the op, the value and the dim.
Tensor checked_index(const Tensor& x, const Tensor& index, int64_t dim, const char* op) {
  ops::check_defined(index, op, "index");
  ops::check_same_device(x, index, op);
  TD_CHECK(index.dim() <= 1, op, ": index must be 1-D, got ", describe(index));
  TD_CHECK(is_integral(index.dtype()), op, ": index must be int32 or int64, got ", describe(index));
  Tensor ic = contiguous_of(index);
  const int64_t n = x.size(dim);
  Tensor flag = scratch_bytes(x, sizeof(int64_t));
  int64_t bad_value = 0;
  const int64_t pos = TD_DISPATCH_INDEX(ic.dtype(), op, [&]<typename I>() {
    return kernels::find_bad_index<I>(ic.data_ptr<I>(), ic.numel(), n, flag.data_ptr(), &bad_value,
                                      stream_of(x));
  });
  TD_CHECK(pos < 0, op, ": index ", bad_value, " is out of range for dim ", dim, " of size ", n,
           " (at position ", pos, " of the index)");
  return ic;
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "index_select";
  OnDevice on(x);
  const Tensor ic = checked_index(x, index, dim, op);
  const int64_t n = ic.numel();
  Shape os = x.sizes();
  os[dim] = n;
  Tensor out = Tensor::empty(os, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const Tensor in = contiguous_of(x.detach());
  const Split3 g = split3(x.sizes(), dim);
  TD_DISPATCH_INDEX(ic.dtype(), op, [&]<typename I>() {
    kernels::index_select<I>(in.data_ptr(), out.data_ptr(), ic.data_ptr<I>(), g.outer, g.mid, n,
                             g.inner, x.element_size(), stream_of(x));
  });
  return out;
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "index_add";
  OnDevice on(x);
  const Tensor ic = checked_index(x, index, dim, op);
  const int64_t n = ic.numel();
  Shape want = x.sizes();
  want[dim] = n;
  TD_CHECK(src.sizes() == want, op, ": source ", describe(src), " must have shape ",
           shape_str(want), " (the input ", shape_str(x.sizes()), " with dim ", dim,
           " of the index's length ", n, ")");
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const Tensor xc = contiguous_of(x.detach()), sc = contiguous_of(src.detach());
  const Split3 g = split3(x.sizes(), dim);
  const size_t nbytes = kernels::index_add_scratch_bytes(n, g.mid);
  Tensor scratch = scratch_bytes(x, nbytes);
  TD_DISPATCH_NUMERIC(x.dtype(), op, [&]<typename T>() {
    TD_DISPATCH_INDEX(ic.dtype(), op, [&]<typename I>() {
      kernels::index_add<cuda_t<T>, I>(ptr<T>(xc), ptr<T>(sc), ic.data_ptr<I>(), ptr<T>(out),
                                       g.outer, g.mid, n, g.inner, scratch.data_ptr(), nbytes,
                                       stream_of(x));
    });
  });
  return out;
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
