#pragma once
// Device discovery for the CUDA backend (internal; not part of the public headers, which must
// compile without nvcc).
namespace td::cuda {

// The number of visible CUDA devices; 0 when there is no driver or no device, or when the
// runtime reports any other error (never throws, so a CPU-only machine can ask safely).
int device_count();

}  // namespace td::cuda
