#pragma once
// What CPU code may ask of the CUDA backend. No CUDA headers here: these functions exist in
// every build; without the CUDA backend they report no devices, and those that need one throw
// td::Error saying the build has no CUDA backend.
#include <cstddef>

#include "tardelli/core/allocator.h"
#include "tardelli/core/device.h"

namespace td {

// True when this library was built with the CUDA backend (TD_WITH_CUDA=ON), GPU or not.
bool cuda_is_built();
// The number of visible CUDA devices: 0 without the CUDA backend, driver or device. Never
// throws.
int cuda_device_count();
bool cuda_available();
// Blocks until all work on `device` (-1: the current device) is done.
void cuda_synchronize(int device = -1);
// Copies nbytes from src on src_device to dst on dst_device (CPU<->CUDA, CUDA<->CUDA, CPU<->CPU)
// and returns when the copy is complete. GPU copies run on the current stream of the CUDA
// device involved (the destination's for CUDA<->CUDA), ordered after work queued there.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
// nbytes of page-locked host memory (cudaHostAlloc): host buffers that GPU copies read or write
// at full PCIe speed and asynchronously. td::Error without the CUDA backend or a device.
// Not counted by memory_stats(kCPU).
DataPtr allocate_pinned_host(size_t nbytes);
// Note [Host snapshot]: queues a copy of nbytes from `src` (memory of CUDA `device`) into the
// page-locked host buffer `dst` on the device's snapshot stream (a side stream, one per device),
// after the work queued so far on the calling thread's current stream, and makes that current
// stream's later work wait for the copy (so nothing overwrites `src` before it is read), all
// without blocking the host. wait_host_snapshots(device) blocks any thread until every snapshot
// copy queued so far on the device has landed. td::Error without the CUDA backend or device.
void snapshot_to_host_async(void* dst, const void* src, size_t nbytes, int device);
void wait_host_snapshots(int device);

}  // namespace td
