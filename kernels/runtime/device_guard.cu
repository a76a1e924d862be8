#include "runtime/cuda_check.cuh"
#include "runtime/device_guard.cuh"

namespace td::cuda {

int current_device() {
  int d = 0;
  TD_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int device) {
  TD_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::DeviceGuard(int device) : previous_(current_device()) {
  if (device >= 0 && device != previous_) {
    set_device(device);
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  // Destructors must not throw (see Note [Destructor never throws] in caching_allocator.cpp);
  // restoring a device that was valid a moment ago fails only if the runtime is gone.
  if (changed_) (void)cudaSetDevice(previous_);
}

}  // namespace td::cuda
