#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tardelli/core/allocator.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/error.h"

using namespace td;

namespace {

// The text of the td::Error that f throws ("" and a test failure if it throws none).
template <typename F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected td::Error";
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

// In every build: the device count is never negative, available means a device exists, and
// CPU-to-CPU copy_bytes copies.
TEST(CudaRuntime, CountAndCpuCopy) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_available(), n > 0);
  if (!cuda_is_built()) {
    EXPECT_EQ(n, 0);
  }
  std::vector<uint8_t> src(1000), dst(1000, 0);
  std::iota(src.begin(), src.end(), uint8_t{7});
  copy_bytes(dst.data(), kCPU, src.data(), kCPU, src.size());
  EXPECT_EQ(dst, src);
}

// What needs a GPU fails with a td::Error that says why: no CUDA backend in this build, or no
// device; on a GPU machine, a device index past the last one is named.
TEST(CudaRuntime, ErrorsAreClear) {
  if (!cuda_available()) {
    const std::string why = cuda_is_built() ? "no CUDA device" : "no CUDA backend";
    std::string msg = error_text([] { cuda_synchronize(); });
    EXPECT_TRUE(contains(msg, "cuda_synchronize")) << msg;
    EXPECT_TRUE(contains(msg, why)) << msg;
    std::vector<uint8_t> host(16);
    msg = error_text([&] { copy_bytes(host.data(), kCPU, host.data(), cuda_device(0), 16); });
    EXPECT_TRUE(contains(msg, "copy_bytes")) << msg;
    EXPECT_TRUE(contains(msg, why)) << msg;
    // No CUDA allocator is registered: the registry says so.
    msg = error_text([] { get_allocator(cuda_device(0)); });
    EXPECT_TRUE(contains(msg, "no allocator for device cuda:0")) << msg;
  } else {
    const int n = cuda_device_count();
    std::string msg = error_text([n] { cuda_synchronize(n); });
    EXPECT_TRUE(contains(msg, "CUDA device " + std::to_string(n) + " does not exist")) << msg;
  }
}

// On a GPU: the registered CUDA allocator hands out device memory and counts it; bytes survive
// host -> device -> device -> host copies exactly; freed memory is cached (reserved stays) until
// empty_cache.
TEST(CudaRuntime, GpuAllocateCopyRoundTrip) {
  if (!cuda_available()) {
    GTEST_SKIP() << "no CUDA device: "
                 << (cuda_is_built() ? "the CUDA runtime found no usable GPU"
                                     : "this build has no CUDA backend");
  }
  const Device gpu = cuda_device(0);
  Allocator& alloc = get_allocator(gpu);
  alloc.empty_cache();
  const MemoryStats before = alloc.stats();
  constexpr size_t kBytes = (size_t{3} << 20) + 123;  // a large block, not a multiple of 512
  constexpr int64_t rounded = (kBytes + 511) / 512 * 512;
  std::vector<uint8_t> host(kBytes), back(kBytes, 0);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  {
    DataPtr a = alloc.allocate(kBytes);
    DataPtr b = alloc.allocate(kBytes);
    ASSERT_NE(a.get(), nullptr);
    ASSERT_NE(b.get(), nullptr);
    const MemoryStats during = alloc.stats();
    EXPECT_EQ(during.current_bytes - before.current_bytes, 2 * rounded);
    EXPECT_EQ(during.num_allocs - before.num_allocs, 2);
    copy_bytes(a.get(), gpu, host.data(), kCPU, kBytes);
    copy_bytes(b.get(), gpu, a.get(), gpu, kBytes);
    copy_bytes(back.data(), kCPU, b.get(), gpu, kBytes);
    EXPECT_EQ(back, host);
    cuda_synchronize();
  }
  const MemoryStats after = alloc.stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_EQ(after.num_frees - before.num_frees, 2);
  EXPECT_GE(after.reserved_bytes - after.current_bytes, 2 * rounded);  // cached for reuse
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, before.reserved_bytes);
}

// allocate_pinned_host: without a device (or backend) a td::Error naming the call; on a GPU,
// page-locked bytes that host code reads and writes and that a device round trip preserves, not
// counted by the CPU allocator.
TEST(CudaRuntime, PinnedHostMemory) {
  if (!cuda_available()) {
    const std::string msg = error_text([] { (void)allocate_pinned_host(64); });
    EXPECT_TRUE(contains(msg, "allocate_pinned_host")) << msg;
    EXPECT_TRUE(contains(msg, cuda_is_built() ? "no CUDA device" : "no CUDA backend")) << msg;
    GTEST_SKIP() << "no CUDA device: the pinned round trip needs a GPU";
  }
  constexpr size_t kBytes = size_t{1} << 20;
  const int64_t cpu_before = memory_stats(kCPU).current_bytes;
  DataPtr pinned = allocate_pinned_host(kBytes);
  DataPtr back = allocate_pinned_host(kBytes);
  EXPECT_EQ(memory_stats(kCPU).current_bytes, cpu_before);
  auto* p = static_cast<uint8_t*>(pinned.get());
  for (size_t i = 0; i < kBytes; ++i) p[i] = static_cast<uint8_t>(i * 17 + 3);
  DataPtr dev = get_allocator(cuda_device(0)).allocate(kBytes);
  copy_bytes(dev.get(), cuda_device(0), pinned.get(), kCPU, kBytes);
  copy_bytes(back.get(), kCPU, dev.get(), cuda_device(0), kBytes);
  EXPECT_EQ(std::memcmp(back.get(), pinned.get(), kBytes), 0);
}
