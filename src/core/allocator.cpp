#include "tardelli/core/allocator.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "tardelli/core/error.h"

namespace td {
namespace {

// Note [CPU caching allocator]: a training step allocates the same activation sizes every
// step. A fresh multi-MiB block from glibc is a new mmap whose pages fault in on first touch
// (measured on the build machine: a fresh 128 MiB zeros() took 78-140 ms, a reused one ~20 ms),
// so large blocks are cached instead of returned: sizes >= kCacheMin are rounded up to a size
// class (eighths of a power of two: at most 12.5% slack) and freed blocks wait in a free list
// per class. Blocks >= kHugeMin are 2 MiB aligned and advised as transparent huge pages (fewer
// faults and TLB misses). The cache is capped at kMaxCached bytes; empty_cache() releases it.
// Small blocks go straight to aligned_alloc (glibc's own bins serve them well).
// Statistics count live bytes (current/peak) apart from reserved (live + cached).
constexpr size_t kCacheMin = size_t{256} << 10;
constexpr size_t kHugeMin = size_t{4} << 20;
constexpr size_t kHugeAlign = size_t{2} << 20;
constexpr int64_t kMaxCached = int64_t{4} << 30;

size_t size_class(size_t n) {
  if (n < kCacheMin) return (n + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  size_t p = size_t{1} << (63 - __builtin_clzll(n));
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

class CpuAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    size_t sz = size_class(nbytes == 0 ? 1 : nbytes);
    void* p = nullptr;
    if (sz >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(sz);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_ -= static_cast<int64_t>(sz);
      }
    }
    if (!p) p = fresh(sz, nbytes);
    int64_t cur = current_.fetch_add(static_cast<int64_t>(sz)) + static_cast<int64_t>(sz);
    int64_t peak = peak_.load();
    while (cur > peak && !peak_.compare_exchange_weak(peak, cur)) {
    }
    allocs_.fetch_add(1);
    return DataPtr(p, [this, sz](void* q) { release(q, sz); });
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    MemoryStats s{current_.load(), peak_.load(), allocs_.load(), frees_.load()};
    s.reserved_bytes = s.current_bytes + cached_;
    return s;
  }
  void reset_peak() override { peak_.store(current_.load()); }
  Device device() const override { return kCPU; }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [sz, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
    free_.clear();
    cached_ = 0;
  }

 private:
  void* fresh(size_t sz, size_t nbytes) {
    size_t align = sz >= kHugeMin ? kHugeAlign : kCpuAlignment;
    size_t rounded = (sz + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (!p) {
      empty_cache();  // give cached blocks back and try once more
      p = std::aligned_alloc(align, rounded);
    }
    TD_CHECK(p != nullptr, "CPU allocator: out of memory allocating ", nbytes, " bytes (",
             current_.load(), " bytes in use)");
    if (sz >= kHugeMin) madvise(p, rounded, MADV_HUGEPAGE);  // advice only; failure is harmless
    return p;
  }

  void release(void* q, size_t sz) {
    current_.fetch_sub(static_cast<int64_t>(sz));
    frees_.fetch_add(1);
    if (sz >= kCacheMin) {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + static_cast<int64_t>(sz) <= kMaxCached) {
        free_[sz].push_back(q);
        cached_ += static_cast<int64_t>(sz);
        return;
      }
    }
    std::free(q);
  }

  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  int64_t cached_ = 0;
  std::atomic<int64_t> current_{0}, peak_{0}, allocs_{0}, frees_{0};
};

struct Registry {
  std::mutex mu;
  Allocator* allocators[2] = {nullptr, nullptr};
};

Registry& registry() {
  static Registry r;
  return r;
}

CpuAllocator& cpu_allocator() {
  // Never destroyed: tensors in static objects may outlive normal static destruction order.
  static auto* a = new CpuAllocator();
  return *a;
}

}  // namespace

Allocator& get_allocator(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Allocator* a = r.allocators[static_cast<int>(d.type)];
#if TD_WITH_CUDA
  TD_CHECK(a != nullptr, "no allocator for device ", d.str(),
           ": the CUDA runtime found no usable GPU on this machine");
#else
  TD_CHECK(a != nullptr, "no allocator for device ", d.str(),
           ": this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
#endif
  return *a;
}

void register_allocator(DeviceType t, Allocator* a) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.allocators[static_cast<int>(t)] = a;
}

DataPtr Allocator::allocate_on(int index, size_t nbytes) {
  TD_CHECK(index == 0, "allocator of ", device().str(), ": no device with index ", index);
  return allocate(nbytes);
}
MemoryStats Allocator::stats_of(int index) const {
  TD_CHECK(index == 0, "allocator of ", device().str(), ": no device with index ", index);
  return stats();
}
void Allocator::reset_peak_of(int index) {
  TD_CHECK(index == 0, "allocator of ", device().str(), ": no device with index ", index);
  reset_peak();
}
void Allocator::empty_cache_of(int index) {
  TD_CHECK(index == 0, "allocator of ", device().str(), ": no device with index ", index);
  empty_cache();
}

MemoryStats memory_stats(Device d) { return get_allocator(d).stats_of(d.index); }
void reset_peak_memory_stats(Device d) { get_allocator(d).reset_peak_of(d.index); }
void empty_cache(Device d) { get_allocator(d).empty_cache_of(d.index); }

}  // namespace td
