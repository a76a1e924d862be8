// The CUDA runtime entry points of a build without the CUDA backend (the CUDA build defines them
// in kernels/runtime/cuda_runtime.cu).
#include "tardelli/core/cuda_runtime.h"

#if !TD_WITH_CUDA
#include <cstring>

#include "tardelli/core/error.h"

namespace td {

bool cuda_is_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}
bool cuda_available() {
  return false;
}

void cuda_synchronize(int device) {
  TD_ERROR("cuda_synchronize(", device,
           "): this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  TD_CHECK(dst_device.is_cpu() && src_device.is_cpu(), "copy_bytes: copy from ", src_device.str(),
           " to ", dst_device.str(),
           ": this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
  if (nbytes > 0) std::memcpy(dst, src, nbytes);
}

void snapshot_to_host_async(void*, const void*, size_t nbytes, int device) {
  TD_ERROR("snapshot_to_host_async(", nbytes, " bytes, cuda:", device,
           "): this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
}

void wait_host_snapshots(int device) {
  TD_ERROR("wait_host_snapshots(cuda:", device,
           "): this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
}

DataPtr allocate_pinned_host(size_t nbytes) {
  TD_ERROR(
      "allocate_pinned_host(", nbytes,
      " bytes): this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
}

}  // namespace td
#endif  // !TD_WITH_CUDA
