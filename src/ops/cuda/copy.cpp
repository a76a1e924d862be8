#if TD_WITH_CUDA
#include "ops/cuda/copy.h"

#include <cstring>

#include "ops/cuda/ew_args.h"
#include "ops/cuda/launch.h"
#include "runtime/cuda_check.cuh"

namespace td::cuda_ops {

namespace {

kernels::CastType cast_type(DType t) {
  switch (t) {
    case DType::Float32:
      return kernels::CastType::F32;
    case DType::BFloat16:
      return kernels::CastType::BF16;
    case DType::Float16:
      return kernels::CastType::F16;
    case DType::Int32:
      return kernels::CastType::I32;
    case DType::Int64:
      return kernels::CastType::I64;
    case DType::Bool:
      return kernels::CastType::Bool;
    case DType::Float8E4M3FN:
      return kernels::CastType::F8E4M3FN;
    case DType::Float8E5M2:
      return kernels::CastType::F8E5M2;
  }
  TD_ERROR("copy_: invalid dtype");
}

}  // namespace

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
  if (is_float8(dst.dtype()) || is_float8(src.dtype())) {
    kernels::ew_cast_fp8(args, cast_type(dst.dtype()), cast_type(src.dtype()),
                         /*saturate=*/false, stream_of(dst));
    return;
  }
  kernels::ew_cast(args, ew_type(dst.dtype()), ew_type(src.dtype()), stream_of(dst));
}

void copy_to_fp8_(const Tensor& dst, const Tensor& src, bool saturate) {
  check_same_cuda_device("to_fp8", dst, {&src});
  TD_CHECK(is_float8(dst.dtype()), "to_fp8: destination ", describe(dst), " is not float8");
  if (dst.numel() == 0) return;
  OnDevice on(dst);
  kernels::EwArgs args = make_ew_args("to_fp8", {&dst, &src});
  kernels::ew_cast_fp8(args, cast_type(dst.dtype()), cast_type(src.dtype()), saturate,
                       stream_of(dst));
}

void scale_to_fp8_(const Tensor& dst, const Tensor& src, float scale) {
  check_same_cuda_device("fp8_quantize", dst, {&src});
  TD_CHECK(is_float8(dst.dtype()) && is_floating(src.dtype()) && dst.sizes() == src.sizes(),
           "fp8_quantize: internal: ", describe(src), " into ", describe(dst));
  if (dst.numel() == 0) return;
  OnDevice on(dst);
  kernels::EwArgs args = make_ew_args("fp8_quantize", {&dst, &src});
  kernels::ew_scale_cast_fp8(args, cast_type(dst.dtype()), cast_type(src.dtype()), scale,
                             stream_of(dst));
}

void fill_(const Tensor& t, double value) {
  if (t.numel() == 0) return;
  OnDevice on(t);
  // The value converted exactly as the CPU's fill_ converts it, then stored as raw bits.
  uint64_t bits = 0;
  TD_DISPATCH_ALL_AND_FLOAT8(t.dtype(), "fill_", [&]<typename T>() {
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
