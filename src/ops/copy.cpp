#include "tardelli/ops/copy.h"

#include <cstring>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/transpose.h"
#include "tardelli/autograd/function.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/view.h"
#if TD_WITH_CUDA
#include "ops/cuda/copy.h"
#endif

namespace td {

// Note [Copies between devices]: bytes move between devices only contiguously and in the
// source dtype (copy_bytes); strides, broadcasting and dtype conversion happen on one device,
// where the backend's copy kernel handles them. A contiguous copy of the same dtype and shape
// is one transfer.
namespace {

void copy_across_devices(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.sizes() == src.sizes()) {
    copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), dst.nbytes());
    return;
  }
  Tensor s = src.is_contiguous() ? src : contiguous(src.detach());
  Tensor staged = Tensor::empty(s.sizes(), s.dtype(), dst.device());
  copy_bytes(staged.data_ptr(), staged.device(), s.data_ptr(), s.device(), s.nbytes());
  copy_into(dst, staged);
}

}  // namespace

void copy_into(const Tensor& dst, const Tensor& src) {
  TD_CHECK(dst.defined() && src.defined(), "copy_: undefined tensor");
  broadcast_shapes(dst.sizes(), src.sizes(), "copy_");  // validates
  TD_CHECK(broadcast_shapes(dst.sizes(), src.sizes(), "copy_") == dst.sizes(), "copy_: source ",
           shape_str(src.sizes()), " cannot be broadcast to destination ", shape_str(dst.sizes()));
  if (dst.numel() == 0) return;
  if (dst.device() != src.device()) return copy_across_devices(dst, src);
#if TD_WITH_CUDA
  if (dst.is_cuda()) return cuda_ops::copy_(dst, src);
#endif
  ops::check_cpu(dst, "copy_");
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.sizes() == src.sizes()) {
    if (dst.data_ptr() != src.data_ptr()) {
      const char* s = static_cast<const char*>(src.data_ptr());
      char* d = static_cast<char*>(dst.data_ptr());
      int64_t nb = static_cast<int64_t>(dst.nbytes());
      cpu::parallel_for(nb, 1 << 20,
                        [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, e - b); });
    }
    return;
  }
  if (cpu::transpose_copy(dst, src)) return;  // Note [Transposed copies]
  if (is_float8(dst.dtype()) && dst.dtype() == src.dtype()) {
    // bytes, not values: a decode and re-encode would canonicalize E5M2's NaN codes
    cpu::map<uint8_t, uint8_t>(dst, [](uint8_t v) { return v; }, {src});
    return;
  }
  // Note [FP8 storage types]: float8 elements convert through float (exact from bf16, f16 and
  // from the integers in FP8's range, so one rounding), without saturation.
  TD_DISPATCH_ALL_AND_FLOAT8(dst.dtype(), "copy_", [&]<typename TD>() {
    TD_DISPATCH_ALL_AND_FLOAT8(src.dtype(), "copy_", [&]<typename TS>() {
      cpu::map<TD, TS>(dst, [](acc_t<TS> v) { return static_cast<acc_t<TD>>(v); }, {src});
    });
  });
}

Tensor to_fp8(const Tensor& t, DType dtype, bool saturate) {
  TD_CHECK(t.defined(), "to_fp8: undefined tensor");
  TD_CHECK(is_float8(dtype), "to_fp8: target dtype must be float8_e4m3fn or float8_e5m2, got ",
           dtype_name(dtype));
  TD_CHECK(!is_float8(t.dtype()) || t.dtype() == dtype, "to_fp8: the input ", describe(t),
           " is already float8; convert it to float32 first to change the format");
  if (!saturate || t.dtype() == dtype) return to_dtype(t, dtype);
  Tensor out = Tensor::empty(t.sizes(), dtype, t.device());
  if (t.numel() == 0) return out;
#if TD_WITH_CUDA
  if (t.is_cuda()) {
    cuda_ops::copy_to_fp8_(out, t.detach(), /*saturate=*/true);
    return out;
  }
#endif
  ops::check_cpu(t, "to_fp8");
  const Fp8Format f = fp8_format_of(dtype);
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  if (t.dtype() == DType::Float32 && t.is_contiguous()) {
    fp8_from_float(t.data_ptr<float>(), o, static_cast<size_t>(t.numel()), f, true);
    return out;
  }
  TD_DISPATCH_ALL(t.dtype(), "to_fp8", [&]<typename T>() {
    cpu::map<uint8_t, T>(
        out,
        [f](acc_t<T> v) { return fp8_from_float(static_cast<float>(v), f, /*saturate=*/true); },
        {t.detach()});
  });
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  TD_CHECK(t.defined(), "to: undefined tensor");
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.sizes(), dtype, t.device());
  copy_into(out, t);
  if (is_floating(dtype) && autograd::needs_grad({t})) {
    autograd::record("ToCopyBackward", {t}, {&out},
                     [src = t.dtype()](const TensorList& g, const auto&) {
                       return TensorList{to_dtype(g[0], src)};
                     });
  }
  return out;
}

Tensor to_device(const Tensor& t, Device device) {
  TD_CHECK(t.defined(), "to: undefined tensor");
  if (t.device() == device) return t;
  TD_CHECK(device.is_cpu() || cuda_is_built(), "to(", device.str(), "): tensor ", describe(t),
           " cannot move to ", device.str(),
           ": this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
  Tensor out = Tensor::empty(t.sizes(), t.dtype(), device);
  copy_into(out, t);
  if (is_floating(t.dtype()) && autograd::needs_grad({t})) {
    autograd::record("ToCopyBackward", {t}, {&out},
                     [src = t.device()](const TensorList& g, const auto&) {
                       return TensorList{to_device(g[0], src)};
                     });
  }
  return out;
}

Tensor clone(const Tensor& t) {
  TD_CHECK(t.defined(), "clone: undefined tensor");
  Tensor out = Tensor::empty(t.sizes(), t.dtype(), t.device());
  copy_into(out, t);
  if (autograd::needs_grad({t})) {
    autograd::record("CloneBackward", {t}, {&out},
                     [](const TensorList& g, const auto&) { return TensorList{g[0]}; });
  }
  return out;
}

Tensor host_snapshot(const Tensor& t) {
  TD_CHECK(t.defined(), "host_snapshot: undefined tensor");
  if (t.device().is_cpu()) {
    Tensor out = Tensor::empty(t.sizes(), t.dtype(), kCPU);
    copy_into(out, t);
    return out;
  }
  const Tensor src = t.contiguous();
  const size_t nbytes = src.nbytes();
  DataPtr bytes = allocate_pinned_host(nbytes);
  auto deleter = bytes.get_deleter();
  Storage st = Storage::wrap(bytes.release(), nbytes, kCPU, std::move(deleter));
  Tensor out =
      Tensor::make(std::move(st), src.sizes(), contiguous_strides(src.sizes()), 0, src.dtype());
  snapshot_to_host_async(out.data_ptr(), src.data_ptr(), nbytes, t.device().index);
  return out;
}

void wait_host_snapshot(Device device) {
  if (device.is_cuda()) wait_host_snapshots(device.index);
}

}  // namespace td
