#if TD_WITH_CUDA
#include "ops/cuda/indexing_ew.h"

#include "ops/cuda/ew_args.h"
#include "ops/cuda/launch.h"

namespace td::cuda_ops {

void masked_fill_into(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  check_same_cuda_device("masked_fill", out, {&x, &mask});
  if (out.numel() == 0) return;
  OnDevice on(out);
  kernels::EwArgs args = make_ew_args("masked_fill", {&out, &x, &mask});
  kernels::ew_masked_fill(args, ew_type(out.dtype()), value, stream_of(out));
}

void where_into(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_cuda_device("where", out, {&cond, &a, &b});
  if (out.numel() == 0) return;
  OnDevice on(out);
  kernels::EwArgs args = make_ew_args("where", {&out, &cond, &a, &b});
  kernels::ew_where(args, ew_type(out.dtype()), stream_of(out));
}

void triangle_into(const Tensor& out, const Tensor& x, bool upper, int64_t k) {
  check_same_cuda_device(upper ? "triu" : "tril", out, {&x});
  TD_CHECK(out.is_contiguous() && out.sizes() == x.sizes(), "triangle: bad output");
  if (out.numel() == 0) return;
  OnDevice on(out);
  Tensor in = contiguous_of(x);
  const int64_t R = x.size(-2), C = x.size(-1);
  kernels::ew_triangle(out.data_ptr(), in.data_ptr(), out.numel() / C, R, C,
                       static_cast<int>(x.element_size()), upper, k, stream_of(out));
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
