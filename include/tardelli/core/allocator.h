#pragma once
// Allocators hand out owning pointers to raw bytes for one device. The CPU allocator aligns
// to 64 bytes (a cache line, and a full AVX-512 vector) and keeps statistics.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "tardelli/core/device.h"

namespace td {

// An owning pointer to device bytes; the deleter returns them to their allocator.
using DataPtr = std::unique_ptr<void, std::function<void(void*)>>;

struct MemoryStats {
  int64_t current_bytes = 0;  // bytes held by live allocations
  int64_t peak_bytes = 0;     // high-water mark of current_bytes since the last reset
  int64_t num_allocs = 0;     // allocations made since start
  int64_t num_frees = 0;
  int64_t reserved_bytes = 0;  // current_bytes plus blocks cached for reuse
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DataPtr allocate(size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached (free) blocks to the system.
  virtual void empty_cache() {}
  virtual Device device() const = 0;

  // Note [Device index]: one allocator is registered per device type; these serve one device
  // of that type by index (a CUDA ordinal). The defaults serve index 0 only (the CPU).
  virtual DataPtr allocate_on(int index, size_t nbytes);
  virtual MemoryStats stats_of(int index) const;
  virtual void reset_peak_of(int index);
  virtual void empty_cache_of(int index);
};

inline constexpr size_t kCpuAlignment = 64;

// The allocator registry: one allocator per device type (the CUDA one is registered by the
// CUDA backend). Returns a process-lifetime object.
Allocator& get_allocator(Device d);
void register_allocator(DeviceType t, Allocator* a);

MemoryStats memory_stats(Device d = kCPU);
void reset_peak_memory_stats(Device d = kCPU);
void empty_cache(Device d = kCPU);

}  // namespace td
