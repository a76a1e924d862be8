#include "tardelli/core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "tardelli/core/error.h"

namespace td {
namespace {

// Note [CPU allocator]: aligned_alloc with 64-byte alignment (sizes rounded up to the
// alignment, as aligned_alloc requires). Statistics are atomics so concurrent allocation from
// data-loader threads stays exact.
class CpuAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    TD_CHECK(p != nullptr, "CPU allocator: out of memory allocating ", nbytes, " bytes (",
             current_.load(), " bytes in use)");
    int64_t cur = current_.fetch_add(static_cast<int64_t>(rounded)) + static_cast<int64_t>(rounded);
    int64_t peak = peak_.load();
    while (cur > peak && !peak_.compare_exchange_weak(peak, cur)) {
    }
    allocs_.fetch_add(1);
    return DataPtr(p, [this, rounded](void* q) {
      std::free(q);
      current_.fetch_sub(static_cast<int64_t>(rounded));
      frees_.fetch_add(1);
    });
  }
  MemoryStats stats() const override {
    return {current_.load(), peak_.load(), allocs_.load(), frees_.load()};
  }
  void reset_peak() override { peak_.store(current_.load()); }
  Device device() const override { return kCPU; }

 private:
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
  TD_CHECK(a != nullptr, "no allocator for device ", d.str(),
           ": this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
  return *a;
}

void register_allocator(DeviceType t, Allocator* a) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.allocators[static_cast<int>(t)] = a;
}

MemoryStats memory_stats(Device d) { return get_allocator(d).stats(); }
void reset_peak_memory_stats(Device d) { get_allocator(d).reset_peak(); }

}  // namespace td
