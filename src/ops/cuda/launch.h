#pragma once
// Glue between td::Tensor and the CUDA kernel launchers of kernels/ (internal; CUDA builds only).
//
// Note [CUDA dispatch]: every op front-end (src/ops/<op>.cpp) checks its arguments, then
//   #if TD_WITH_CUDA
//     if (x.is_cuda()) return cuda_ops::<op>(...);   // src/ops/cuda/<family>.{h,cpp}
//   #endif
//     ops::check_cpu(x, "<op>");                        // the CPU path follows
// so the CPU build keeps its clear "only a CPU implementation in this build" error, and the
// autograd recording around the call stays shared between devices. The glue in src/ops/cuda/
// makes inputs contiguous (or checks the strides the kernel accepts), checks that every tensor is
// on the same device, allocates outputs on it, sets the device, and launches on that device's
// current stream. Kernels (kernels/<family>/) take raw pointers and a cudaStream_t and know
// nothing of Tensor. td::BFloat16 / td::Float16 have the same bits as __nv_bfloat16 / __half,
// so pointers are reinterpreted (cuda_t<T> below).
#if !TD_WITH_CUDA
#error "src/ops/cuda/ is compiled only in CUDA builds (TD_WITH_CUDA=1)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "ops/common.h"
#include "runtime/device_guard.cuh"
#include "runtime/stream.cuh"
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

template <typename T>
struct cuda_type {
  using type = T;
};
template <>
struct cuda_type<BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct cuda_type<Float16> {
  using type = __half;
};
template <typename T>
using cuda_t = typename cuda_type<T>::type;

static_assert(sizeof(BFloat16) == sizeof(__nv_bfloat16) && sizeof(Float16) == sizeof(__half));

// The tensor's first element as the kernel's element type (checks the dtype).
template <typename T>
cuda_t<T>* ptr(const Tensor& t) {
  return reinterpret_cast<cuda_t<T>*>(t.data_ptr<T>());
}
// An optional tensor's pointer, or nullptr when it is undefined.
template <typename T>
cuda_t<T>* ptr_or_null(const Tensor& t) {
  return t.defined() ? ptr<T>(t) : nullptr;
}

// The current stream of the tensor's device.
inline cudaStream_t stream_of(const Tensor& t) {
  return cuda::current_stream(t.device().index).handle();
}

// Makes the tensor's device current for a scope (kernels launch on the current device).
class OnDevice {
 public:
  explicit OnDevice(const Tensor& t) : guard_(t.device().index) {}

 private:
  cuda::DeviceGuard guard_;
};

// Every defined tensor in `ts` is on `ref`'s device (a td::Error naming the op otherwise).
inline void check_same_cuda_device(const char* op, const Tensor& ref,
                                   std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->defined()) ops::check_same_device(ref, *t, op);
  }
}

// A contiguous tensor with t's values: t itself when already contiguous.
inline Tensor contiguous_of(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Scratch memory on t's device from the caching allocator, freed (stream-ordered) with the
// returned tensor: keep it alive until the kernels using it have been queued.
inline Tensor scratch_bytes(const Tensor& like, size_t nbytes) {
  return Tensor::empty({static_cast<int64_t>((nbytes + 3) / 4)}, DType::Float32, like.device());
}

}  // namespace td::cuda_ops
