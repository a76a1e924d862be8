#if TD_WITH_CUDA
#include "ops/cuda/copy.h"

#include <cstring>

#include "ops/cuda/ew_args.h"
#include "ops/cuda/launch.h"
#include "runtime/cuda_check.cuh"

namespace td::cuda_ops {

void copy_(const Tensor& dst, const Tensor& src) {
  check_same_cuda_device("copy_", dst, {&src});
  if (dst.numel() == 0) return;
  OnDevice on(dst);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.sizes() == src.sizes()) {
    if (dst.data_ptr() != src.data_ptr()) {
      TD_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                    cudaMemcpyDeviceToDevice, stream_of(dst)));
    }
    return;
  }
  kernels::EwArgs args = make_ew_args("copy_", {&dst, &src});
  kernels::ew_cast(args, ew_type(dst.dtype()), ew_type(src.dtype()), stream_of(dst));
}

void fill_(const Tensor& t, double value) {
  if (t.numel() == 0) return;
  OnDevice on(t);
  // The value converted exactly as the CPU's fill_ converts it, then stored as raw bits.
  uint64_t bits = 0;
  TD_DISPATCH_ALL(t.dtype(), "fill_", [&]<typename T>() {
    T v = static_cast<T>(static_cast<acc_t<T>>(value));
    std::memcpy(&bits, &v, sizeof(T));
  });
  if (bits == 0 && t.is_contiguous()) {
    TD_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), stream_of(t)));
    return;
  }
  kernels::EwArgs args = make_ew_args("fill_", {&t});
  kernels::ew_fill(args, static_cast<int>(t.element_size()), bits, stream_of(t));
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
