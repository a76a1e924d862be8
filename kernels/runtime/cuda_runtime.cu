// The public CUDA runtime entry points (include/tardelli/core/cuda_runtime.h) of the CUDA build.
#include <cstring>
#include <map>
#include <mutex>

#include "device/device_query.cuh"
#include "runtime/cuda_allocator.cuh"
#include "runtime/cuda_check.cuh"
#include "runtime/deferred_checks.cuh"
#include "runtime/device_guard.cuh"
#include "runtime/stream.cuh"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/error.h"

namespace td {
namespace {

void check_device(const char* what, int device) {
  const int n = cuda::device_count();
  TD_CHECK(n > 0, what,
           ": no CUDA device is available (the CUDA runtime found no usable GPU or "
           "driver)");
  TD_CHECK(device < n, what, ": CUDA device ", device, " does not exist (", n, " visible)");
}

// Note [Host snapshot]: one snapshot stream per device, created on first use.
cuda::Stream snapshot_stream(int device) {
  static std::mutex mu;
  static std::map<int, cuda::Stream> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(device);
  if (it == streams.end()) it = streams.emplace(device, cuda::Stream::create(device)).first;
  return it->second;
}

}  // namespace

void snapshot_to_host_async(void* dst, const void* src, size_t nbytes, int device) {
  check_device("snapshot_to_host_async", device);
  if (nbytes == 0) return;
  cuda::DeviceGuard guard(device);
  cuda::Stream main = cuda::current_stream(device);
  cuda::Stream side = snapshot_stream(device);
  cuda::Event ready;
  ready.record(main);
  side.wait(ready);  // after what the training queued so far
  cuda::copy_d2h(dst, src, nbytes, side);
  cuda::Event copied;
  copied.record(side);
  main.wait(copied);  // later work (an optimizer step) may overwrite src only after the copy
}

void wait_host_snapshots(int device) {
  check_device("wait_host_snapshots", device);
  snapshot_stream(device).synchronize();
}

bool cuda_is_built() {
  return true;
}
int cuda_device_count() {
  return cuda::device_count();
}
bool cuda_available() {
  return cuda::device_count() > 0;
}

void cuda_synchronize(int device) {
  check_device("cuda_synchronize", device);
  cuda::DeviceGuard guard(device);
  TD_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::run_deferred_checks();  // Note [Deferred device checks]
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
    return;
  }
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  check_device("copy_bytes", gpu.index);
  if (nbytes == 0) return;
  cuda::Stream stream = cuda::current_stream(gpu.index);
  if (dst_device.is_cpu()) {
    cuda::copy_d2h(dst, src, nbytes, stream);
  } else if (src_device.is_cpu()) {
    cuda::copy_h2d(dst, src, nbytes, stream);
  } else {
    cuda::copy_d2d(dst, src, nbytes, stream);
  }
  stream.synchronize();
  // The host waited for the device: run the checks deferred until such a point.
  if (dst_device.is_cpu()) cuda::run_deferred_checks();
}

DataPtr allocate_pinned_host(size_t nbytes) {
  TD_CHECK(cuda::device_count() > 0, "allocate_pinned_host(", nbytes,
           " bytes): no CUDA device is visible");
  return cuda::allocate_pinned(nbytes);
}

}  // namespace td
