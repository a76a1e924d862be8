#include "tardelli/core/caching_allocator.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "tardelli/core/error.h"

namespace td {

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  // (stream, size, address): a lower_bound on (stream, size, null) is the best fit on stream.
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<DeviceMemoryBackend> backend)
    : device_(device), backend_(std::move(backend)) {
  TD_CHECK(backend_ != nullptr, "CachingAllocator: a memory backend is required");
}

CachingAllocator::~CachingAllocator() {
  // Note [Destructor never throws]: a backend failing while the process shuts down (the CUDA
  // runtime may already be unloading) must not terminate it; the memory goes with the process.
  try {
    empty_cache();
  } catch (const Error&) {
  }
}

CachingAllocator::Block* CachingAllocator::find_free(Pool& pool, uint64_t stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, uint64_t stream, bool small,
                                                       size_t nbytes) {
  size_t seg = segment_size(size);
  void* raw = backend_->raw_alloc(seg);
  if (raw == nullptr) {
    // Out of memory: give every fully free segment back, then try once more.
    ++oom_retries_;
    release_cached();
    raw = backend_->raw_alloc(seg);
  }
  if (raw == nullptr) {
    TD_ERROR(device_.str(), " out of memory: tried to allocate ", nbytes, " bytes (a ", seg,
             "-byte segment); ", allocated_, " bytes allocated, ", reserved_,
             " bytes reserved by the caching allocator (after returning its cached segments)");
  }
  auto block = std::make_unique<Block>();
  block->ptr = static_cast<char*>(raw);
  block->size = seg;
  block->stream = stream;
  block->small = small;
  Block* b = block.get();
  blocks_.emplace(raw, std::move(block));
  reserved_ += static_cast<int64_t>(seg);
  ++segments_;
  return b;
}

DataPtr CachingAllocator::allocate(size_t nbytes, uint64_t stream) {
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  std::lock_guard<std::mutex> lock(mu_);
  Pool& pool = small ? small_pool_ : large_pool_;
  Block* b = find_free(pool, stream, size);
  if (b == nullptr) b = new_segment(size, stream, small, nbytes);

  const size_t remaining = b->size - size;
  if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    auto rest = std::make_unique<Block>();
    rest->ptr = b->ptr + size;
    rest->size = remaining;
    rest->stream = stream;
    rest->small = small;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest.get();
    b->next = rest.get();
    b->size = size;
    pool.insert(rest.get());
    blocks_.emplace(rest->ptr, std::move(rest));
  }
  b->allocated = true;
  allocated_ += static_cast<int64_t>(b->size);
  peak_ = std::max(peak_, allocated_);
  ++num_allocs_;
  return DataPtr(b->ptr, [this](void* p) { free_block(p); });
}

void CachingAllocator::free_block(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || !it->second->allocated) return;  // not ours: cannot happen
  Block* b = it->second.get();
  b->allocated = false;
  allocated_ -= static_cast<int64_t>(b->size);
  ++num_frees_;
  Pool& pool = pool_of(b);
  // Merge with a free previous neighbour: it absorbs b.
  if (Block* p = b->prev; p != nullptr && !p->allocated) {
    pool.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    blocks_.erase(b->ptr);
    b = p;
  }
  // Merge with a free next neighbour: b absorbs it.
  if (Block* n = b->next; n != nullptr && !n->allocated) {
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    blocks_.erase(n->ptr);
  }
  pool.insert(b);
}

void CachingAllocator::release_cached() {
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    std::vector<Block*> whole;
    for (Block* b : *pool) {
      // A whole segment, unless a live graph still replays into it (Note [Graph memory pools]).
      if (b->prev == nullptr && b->next == nullptr && !retained_.contains(b->stream)) {
        whole.push_back(b);
      }
    }
    for (Block* b : whole) {
      pool->erase(b);
      backend_->raw_free(b->ptr);
      reserved_ -= static_cast<int64_t>(b->size);
      --segments_;
      blocks_.erase(b->ptr);
    }
  }
}

void CachingAllocator::retain_stream(uint64_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  ++retained_[stream];
}

void CachingAllocator::release_stream(uint64_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = retained_.find(stream);
  TD_CHECK(it != retained_.end(), device_.str(), ": release_stream(", stream,
           ") without a matching retain_stream");
  if (--it->second == 0) retained_.erase(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryStats s;
  s.current_bytes = allocated_;
  s.peak_bytes = peak_;
  s.num_allocs = num_allocs_;
  s.num_frees = num_frees_;
  s.reserved_bytes = reserved_;
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = allocated_;
}

CacheInfo CachingAllocator::cache_info() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheInfo info;
  info.segments = segments_;
  info.free_blocks = static_cast<int64_t>(small_pool_.size() + large_pool_.size());
  for (const Pool* pool : {&small_pool_, &large_pool_}) {
    for (const Block* b : *pool) {
      info.largest_free_block = std::max(info.largest_free_block, static_cast<int64_t>(b->size));
    }
  }
  info.oom_retries = oom_retries_;
  return info;
}

}  // namespace td
