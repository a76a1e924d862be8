#pragma once
// td::CachingAllocator: the policy of a device caching allocator (after PyTorch's
// CUDACachingAllocator), independent of CUDA. It takes whole segments from a
// DeviceMemoryBackend (cudaMalloc in the CUDA backend, a fake in tests), carves blocks out of
// them, and keeps freed blocks cached for reuse by later requests on the same stream.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "tardelli/core/allocator.h"

namespace td {

// Where segments come from. raw_alloc returns null when the device is out of memory (any other
// failure throws td::Error); raw_free takes back exactly what raw_alloc gave.
class DeviceMemoryBackend {
 public:
  virtual ~DeviceMemoryBackend() = default;
  virtual void* raw_alloc(size_t nbytes) = 0;
  virtual void raw_free(void* ptr) = 0;
};

// What the cache holds beyond MemoryStats (for tests and memory reports).
struct CacheInfo {
  int64_t segments = 0;            // segments held from the backend
  int64_t free_blocks = 0;         // cached blocks, not handed out
  int64_t largest_free_block = 0;  // bytes
  int64_t oom_retries = 0;         // times an out-of-memory freed the cache and retried
};

// Note [Caching allocator policy]:
// - Sizes are rounded up to kMinBlockSize (512 B), so every block is 512-byte aligned.
// - Small requests (<= kSmallSize, 1 MiB) are carved from kSmallBuffer (2 MiB) segments; large
//   requests under kMinLargeAlloc (10 MiB) from kLargeBuffer (20 MiB) segments, so mid-sized
//   activations share segments; larger ones get a segment of their own rounded up to 2 MiB.
//   Small and large blocks live in separate pools, so small tensors never fragment the large
//   segments.
// - A block is found best-fit (smallest cached block that is big enough) among the free blocks
//   of the requesting stream only: memory freed on stream S may still be read by work queued on
//   S, and handing it to another stream would race (cross-stream use needs events: not yet).
//   A segment belongs to the stream that first asked for it, and so do all its blocks.
// - The remainder of a block is split off when it is worth keeping: >= 512 B in the small pool,
//   > 1 MiB in the large pool (else the whole block is handed out and counted as allocated).
// - A freed block merges with free neighbours of its segment, so a fully freed segment becomes
//   one block again, which empty_cache() can return.
// - When the backend is out of memory, every fully free segment (of any stream) is returned and
//   the request retried once; a second failure throws td::Error naming the request, allocated
//   and reserved bytes.
// Statistics: current_bytes counts allocated blocks (rounded sizes), reserved_bytes counts
// segments. Thread-safe: one mutex guards everything.
class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kMinBlockSize = 512;
  static constexpr size_t kSmallSize = size_t{1} << 20;
  static constexpr size_t kSmallBuffer = size_t{2} << 20;
  static constexpr size_t kLargeBuffer = size_t{20} << 20;
  static constexpr size_t kMinLargeAlloc = size_t{10} << 20;
  static constexpr size_t kRoundLarge = size_t{2} << 20;

  CachingAllocator(Device device, std::unique_ptr<DeviceMemoryBackend> backend);
  // Returns the cached segments. Memory still handed out is not returned (it is in use); its
  // DataPtrs must not outlive the allocator.
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Allocates on stream 0 (the default stream).
  DataPtr allocate(size_t nbytes) override { return allocate(nbytes, 0); }
  // Allocates nbytes for use on `stream` (an opaque id: the cudaStream_t's address in the CUDA
  // backend). The memory is 512-byte aligned; 0 bytes still gives a (512-byte) block.
  DataPtr allocate(size_t nbytes, uint64_t stream);

  // Note [Graph memory pools]: a captured CUDA graph replays its kernels on the addresses they
  // had at capture, so the memory allocated during the capture (on the capture stream, whose
  // id keys those blocks: no other work allocates on it) must stay reserved while the graph
  // lives, even when its tensors were freed within the capture (the graph still writes
  // there). retain_stream(id) keeps every segment of that stream out of empty_cache() and the
  // out-of-memory release; release_stream(id) ends that (calls nest: counted).
  void retain_stream(uint64_t stream);
  void release_stream(uint64_t stream);

  MemoryStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;
  Device device() const override { return device_; }
  CacheInfo cache_info() const;
  DeviceMemoryBackend& backend() { return *backend_; }

  // The size a request of nbytes takes from a segment, and the segment size a request of that
  // rounded size asks the backend for.
  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    uint64_t stream = 0;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours in the same segment
    Block* next = nullptr;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;

  Block* find_free(Pool& pool, uint64_t stream, size_t size);
  Block* new_segment(size_t size, uint64_t stream, bool small, size_t nbytes);
  void free_block(void* ptr);
  void release_cached();  // requires mu_
  Pool& pool_of(const Block* b) { return b->small ? small_pool_ : large_pool_; }

  const Device device_;
  std::unique_ptr<DeviceMemoryBackend> backend_;
  mutable std::mutex mu_;
  // Every block (handed out or cached), by address: the owner of Block objects.
  std::unordered_map<void*, std::unique_ptr<Block>> blocks_;
  Pool small_pool_, large_pool_;  // the cached blocks
  int64_t allocated_ = 0, reserved_ = 0, peak_ = 0, num_allocs_ = 0, num_frees_ = 0;
  int64_t segments_ = 0, oom_retries_ = 0;
  std::unordered_map<uint64_t, int>
      retained_;  // stream -> retain count (Note [Graph memory pools])
};

}  // namespace td
