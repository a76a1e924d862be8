#include <cuda_runtime.h>

#include "device/device_query.cuh"

namespace td::cuda {

int device_count() {
  int n = 0;
  // Note [No driver]: without a driver cudaGetDeviceCount returns cudaErrorInsufficientDriver
  // (35) rather than crashing; any error means "no usable device". The error is sticky only
  // for the last-error slot, which cudaGetLastError clears so later calls start clean.
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace td::cuda
