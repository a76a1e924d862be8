#pragma once
// Device memory for the CUDA backend: the per-device caching allocators (registered as the
// allocator of DeviceType::CUDA when a GPU is present), pinned host memory, and asynchronous
// copies between host and device.
#include <cstddef>

#include "runtime/stream.cuh"
#include "tardelli/core/caching_allocator.h"

namespace td::cuda {

// The caching allocator of `device` (-1: the current device); created on first use, never
// destroyed (tensors in static objects may outlive static destruction).
CachingAllocator& caching_allocator(int device = -1);

// Page-locked host memory (cudaHostAlloc): needed for copies that truly overlap compute, and
// faster for any copy. Not cached yet: each call is a cudaHostAlloc, each free a cudaFreeHost.
DataPtr allocate_pinned(size_t nbytes);

// Queue a copy of `bytes` on `stream` and return at once. With pageable host memory the copy
// may complete before returning (the driver stages it); with pinned memory it is truly
// asynchronous, so the host buffer must stay alive and untouched until the stream reaches it.
// copy_d2d also copies between devices (unified addressing).
void copy_h2d(void* dst, const void* src, size_t bytes, const Stream& stream);
void copy_d2h(void* dst, const void* src, size_t bytes, const Stream& stream);
void copy_d2d(void* dst, const void* src, size_t bytes, const Stream& stream);

}  // namespace td::cuda
