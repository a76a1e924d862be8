#if TD_WITH_CUDA
#include "ops/cuda/reduction.h"

#include <algorithm>

#include "ops/cuda/launch.h"
#include "reduction/reduction.cuh"

namespace td::cuda_ops {
namespace {

// x's values as a contiguous [outer, count, inner] array (the kernels' view) plus that shape.
struct Layout {
  Tensor data;
  kernels::ReduceDims dims;
};

// x itself when it is contiguous and its reduced dims are adjacent once dims of size 1 are
// ignored (sum over the leading, middle or trailing dims: no copy); otherwise the rows layout
// (the reduced dims permuted last, one copy) with inner = 1.
Layout layout_of(const Tensor& x, const ops::ReducePlan& p) {
  Tensor xd = x.detach();
  if (xd.is_contiguous()) {
    enum { kBefore, kInside, kAfter } phase = kBefore;
    int64_t outer = 1, inner = 1;
    bool adjacent = true;
    for (int64_t i = 0; i < xd.dim() && adjacent; ++i) {
      const int64_t n = xd.size(i);
      if (n == 1) continue;
      if (std::binary_search(p.dims.begin(), p.dims.end(), i)) {
        adjacent = phase != kAfter;
        phase = kInside;
      } else if (phase == kBefore) {
        outer *= n;
      } else {
        phase = kAfter;
        inner *= n;
      }
    }
    if (adjacent) return {xd, {outer, p.count, inner}};
  }
  return {ops::rows_layout(x, p), {numel_of(p.out_keep), p.count, 1}};
}

}  // namespace

void sum_into(const Tensor& x, const ops::ReducePlan& p, const Tensor& out, double scale) {
  check_same_cuda_device("sum", x, {&out});
  OnDevice on(x);
  const Layout l = layout_of(x, p);
  Tensor scratch = scratch_bytes(x, kernels::reduce_scratch_bytes(l.dims));
  TD_DISPATCH_ALL(x.dtype(), "sum", [&]<typename T>() {
    using K = cuda_t<T>;
    kernels::reduce_sum<K>(ptr<T>(l.data), static_cast<kernels::sum_out_t<K>*>(out.data_ptr()),
                           l.dims, scale, scratch.data_ptr(), stream_of(x));
  });
}

void extremum_into(const Tensor& x, const ops::ReducePlan& p, const Tensor& values,
                   const Tensor* indices, bool is_max) {
  const char* op = is_max ? "max" : "min";
  check_same_cuda_device(op, x, {&values});
  if (indices) check_same_cuda_device(op, x, {indices});
  OnDevice on(x);
  const Layout l = layout_of(x, p);
  Tensor scratch = scratch_bytes(x, kernels::reduce_scratch_bytes(l.dims));
  int64_t* ip = indices ? indices->data_ptr<int64_t>() : nullptr;
  TD_DISPATCH_ALL(x.dtype(), op, [&]<typename T>() {
    kernels::reduce_extremum<cuda_t<T>>(ptr<T>(l.data), ptr<T>(values), ip, l.dims, is_max,
                                        scratch.data_ptr(), stream_of(x));
  });
}

void var_into(const Tensor& x, const ops::ReducePlan& p, const Tensor& out, double divisor) {
  check_same_cuda_device("var", x, {&out});
  OnDevice on(x);
  const Layout l = layout_of(x, p);
  Tensor scratch = scratch_bytes(x, kernels::reduce_scratch_bytes(l.dims, /*for_var=*/true));
  TD_DISPATCH_FLOATING(x.dtype(), "var", [&]<typename T>() {
    kernels::reduce_var<cuda_t<T>>(ptr<T>(l.data), ptr<T>(out), l.dims, divisor, scratch.data_ptr(),
                                   stream_of(x));
  });
}

void norm_into(const Tensor& x, const Tensor& out) {
  check_same_cuda_device("norm", x, {&out});
  OnDevice on(x);
  const Tensor in = contiguous_of(x.detach());
  const int64_t n = in.numel();
  Tensor scratch = scratch_bytes(x, kernels::reduce_scratch_bytes({1, n, 1}));
  TD_DISPATCH_FLOATING(x.dtype(), "norm", [&]<typename T>() {
    kernels::reduce_norm<cuda_t<T>>(ptr<T>(in), ptr<T>(out), n, scratch.data_ptr(), stream_of(x));
  });
}

Tensor max_backward_rows(const Tensor& g, const Tensor& idx, int64_t rows, int64_t n) {
  check_same_cuda_device("max_backward", g, {&idx});
  OnDevice on(g);
  const Tensor gc = contiguous_of(g), ic = contiguous_of(idx);
  TD_CHECK(gc.numel() == rows && ic.numel() == rows && ic.dtype() == DType::Int64,
           "max_backward: expected ", rows, " gradients and int64 indices, got ", describe(gc),
           " and ", describe(ic));
  Tensor z = Tensor::empty({rows, n}, g.dtype(), g.device());
  TD_DISPATCH_FLOATING(g.dtype(), "max_backward", [&]<typename T>() {
    kernels::max_backward_rows<cuda_t<T>>(ptr<T>(gc), ic.data_ptr<int64_t>(), ptr<T>(z), rows, n,
                                          stream_of(g));
  });
  return z;
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
