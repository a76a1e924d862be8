#include <memory>
#include <mutex>
#include <vector>

#include "device/device_query.cuh"
#include "runtime/cuda_allocator.cuh"
#include "runtime/cuda_check.cuh"
#include "runtime/device_guard.cuh"
#include "tardelli/core/error.h"

namespace td::cuda {
namespace {

// Note [Graph memory pools]: cudaMalloc is a "potentially unsafe" call that a thread capturing a
// graph in the default (global / thread-local) mode may not make; the allocator's own calls are
// safe (the memory is not used by the capture until the allocator hands it out), so they run in
// relaxed mode, as PyTorch's allocator does.
class RelaxedCapture {
 public:
  RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Segments straight from cudaMalloc on one device. Out of memory is reported as null so the
// caching allocator can free its cache and retry; any other error throws.
class CudaMallocBackend final : public DeviceMemoryBackend {
 public:
  explicit CudaMallocBackend(int device) : device_(device) {}

  void* raw_alloc(size_t nbytes) override {
    DeviceGuard guard(device_);
    RelaxedCapture relaxed;  // a segment may be needed while this thread captures a graph
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it for later checks
      return nullptr;
    }
    TD_CUDA_CHECK(err);
    return p;
  }

  void raw_free(void* ptr) override {
    DeviceGuard guard(device_);
    RelaxedCapture relaxed;
    TD_CUDA_CHECK(cudaFree(ptr));
  }

 private:
  int device_;
};

// Note [One allocator for all CUDA devices]: the registry holds one Allocator per device type; it
// serves device `index` (Storage::allocate passes the tensor's device) on that device's current
// stream from that device's CachingAllocator. The index-free calls mean the current device.
class CudaAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override { return allocate_on(current_device(), nbytes); }
  DataPtr allocate_on(int index, size_t nbytes) override {
    return caching_allocator(index).allocate(nbytes, current_stream(index).id());
  }
  MemoryStats stats() const override { return caching_allocator(-1).stats(); }
  void reset_peak() override { caching_allocator(-1).reset_peak(); }
  void empty_cache() override { caching_allocator(-1).empty_cache(); }
  MemoryStats stats_of(int index) const override { return caching_allocator(index).stats(); }
  void reset_peak_of(int index) override { caching_allocator(index).reset_peak(); }
  void empty_cache_of(int index) override { caching_allocator(index).empty_cache(); }
  Device device() const override { return Device(DeviceType::CUDA, current_device()); }
};

struct PerDevice {
  std::mutex mu;
  std::vector<std::unique_ptr<CachingAllocator>> allocators;
};

PerDevice& per_device() {
  static auto* p = new PerDevice();  // never destroyed: see caching_allocator()
  return *p;
}

// Note [Registration at load]: registering from a static initializer means get_allocator(cuda)
// works as soon as the library is loaded, with no init call. It asks the driver for the device
// count once at load (initializing it); without a device nothing is registered and
// get_allocator(cuda) keeps raising its error.
struct RegisterCudaAllocator {
  RegisterCudaAllocator() {
    if (device_count() > 0) {
      static auto* allocator = new CudaAllocator();
      register_allocator(DeviceType::CUDA, allocator);
    }
  }
};
const RegisterCudaAllocator register_cuda_allocator;

}  // namespace

CachingAllocator& caching_allocator(int device) {
  const int d = device < 0 ? current_device() : device;
  PerDevice& p = per_device();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.allocators.empty()) p.allocators.resize(static_cast<size_t>(device_count()));
  TD_CHECK(d >= 0 && d < static_cast<int>(p.allocators.size()), "CUDA device ", d,
           " does not exist (", p.allocators.size(), " visible)");
  auto& a = p.allocators[static_cast<size_t>(d)];
  if (!a)
    a = std::make_unique<CachingAllocator>(Device(DeviceType::CUDA, d),
                                           std::make_unique<CudaMallocBackend>(d));
  return *a;
}

DataPtr allocate_pinned(size_t nbytes) {
  void* p = nullptr;
  TD_CUDA_CHECK(cudaHostAlloc(&p, nbytes == 0 ? 1 : nbytes, cudaHostAllocDefault));
  return DataPtr(p, [](void* q) { (void)cudaFreeHost(q); });  // a deleter must not throw
}

void copy_h2d(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  DeviceGuard guard(stream.device());
  TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream.handle()));
}

void copy_d2h(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  DeviceGuard guard(stream.device());
  TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream.handle()));
}

void copy_d2d(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  DeviceGuard guard(stream.device());
  TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream.handle()));
}

}  // namespace td::cuda
