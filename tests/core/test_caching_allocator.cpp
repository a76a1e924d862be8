#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "tardelli/core/caching_allocator.h"
#include "tardelli/core/error.h"

using namespace td;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// A backend with no memory behind it: it hands out distinct fake addresses (never
// dereferenced by the allocator), counts calls, and can be limited in capacity or told to fail.
// The allocator calls it under its own lock, so it needs none.
class FakeBackend final : public DeviceMemoryBackend {
 public:
  void* raw_alloc(size_t nbytes) override {
    ++raw_allocs;
    if (fail_next > 0) {
      --fail_next;
      return nullptr;
    }
    if (live_bytes + nbytes > capacity) return nullptr;
    uintptr_t p = next_;
    next_ += nbytes + (size_t{64} << 20);  // a gap: segments are never adjacent
    live[p] = nbytes;
    live_bytes += nbytes;
    return reinterpret_cast<void*>(p);
  }
  void raw_free(void* ptr) override {
    ++raw_frees;
    auto it = live.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_NE(it, live.end()) << "raw_free of a pointer the backend never gave";
    live_bytes -= it->second;
    live.erase(it);
  }

  int64_t raw_allocs = 0, raw_frees = 0;
  int fail_next = 0;           // this many raw_allocs return null first
  size_t capacity = SIZE_MAX;  // raw_alloc fails past this many live bytes
  size_t live_bytes = 0;
  std::map<uintptr_t, size_t> live;  // segment address -> size

 private:
  uintptr_t next_ = uintptr_t{1} << 40;
};

struct Fixture {
  FakeBackend* fake;  // owned by alloc
  std::unique_ptr<CachingAllocator> alloc;
  Fixture() {
    auto b = std::make_unique<FakeBackend>();
    fake = b.get();
    alloc = std::make_unique<CachingAllocator>(cuda_device(0), std::move(b));
  }
};

uintptr_t addr(const DataPtr& p) {
  return reinterpret_cast<uintptr_t>(p.get());
}

}  // namespace

// Rounding: 512-byte granularity; small requests take 2 MiB segments, mid-sized 20 MiB ones,
// big ones their own size rounded up to 2 MiB.
TEST(CachingAllocator, RoundingAndSegmentSizes) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(11 * kMiB + 512), 12 * kMiB);
}

// A freed block is reused by the next request of a size it can hold, with no new raw alloc,
// and the pointer is 512-byte aligned relative to its segment.
TEST(CachingAllocator, ReuseWithoutRawAlloc) {
  Fixture f;
  uintptr_t first;
  {
    DataPtr p = f.alloc->allocate(1000);
    first = addr(p);
    EXPECT_EQ(f.fake->raw_allocs, 1);
    EXPECT_EQ(f.fake->live.begin()->second, 2 * kMiB);
  }
  DataPtr q = f.alloc->allocate(700);  // same rounded size (1024)
  EXPECT_EQ(addr(q), first);
  EXPECT_EQ(f.fake->raw_allocs, 1);
  DataPtr big = f.alloc->allocate(30 * kMiB);
  big.reset();
  DataPtr big2 = f.alloc->allocate(29 * kMiB);  // fits the cached 30 MiB block
  EXPECT_EQ(f.fake->raw_allocs, 2);
  EXPECT_EQ(addr(q) % 512, 0u);
}

// Memory freed on one stream is never handed to another: a request on stream 2 takes a new
// segment although stream 1 has a cached block of the right size; stream 1 gets its own back.
TEST(CachingAllocator, PerStreamIsolation) {
  Fixture f;
  DataPtr a = f.alloc->allocate(4096, 1);
  uintptr_t a_addr = addr(a);
  a.reset();
  DataPtr b = f.alloc->allocate(4096, 2);
  EXPECT_EQ(f.fake->raw_allocs, 2);
  EXPECT_NE(addr(b), a_addr);
  DataPtr c = f.alloc->allocate(4096, 1);
  EXPECT_EQ(addr(c), a_addr);
  EXPECT_EQ(f.fake->raw_allocs, 2);
  // Large pool too.
  DataPtr l1 = f.alloc->allocate(12 * kMiB, 1);
  l1.reset();
  DataPtr l2 = f.alloc->allocate(12 * kMiB, 2);
  EXPECT_EQ(f.fake->raw_allocs, 4);
}

// Split and merge: three blocks carved from one segment; freeing the middle, then both
// neighbours, leaves one free block as large as the segment, which a segment-sized request
// then takes without a raw alloc.
TEST(CachingAllocator, SplitAndMerge) {
  Fixture f;
  DataPtr a = f.alloc->allocate(256 * 1024);
  DataPtr b = f.alloc->allocate(256 * 1024);
  DataPtr c = f.alloc->allocate(256 * 1024);
  EXPECT_EQ(f.fake->raw_allocs, 1);
  EXPECT_EQ(addr(b), addr(a) + 256 * 1024);  // carved back to back
  EXPECT_EQ(addr(c), addr(b) + 256 * 1024);
  uintptr_t base = addr(a);
  b.reset();
  EXPECT_EQ(f.alloc->cache_info().free_blocks, 2);  // b's hole and the segment's tail
  a.reset();
  EXPECT_EQ(f.alloc->cache_info().free_blocks, 2);  // a merged with b
  c.reset();
  CacheInfo info = f.alloc->cache_info();
  EXPECT_EQ(info.free_blocks, 1);  // everything merged back into the segment
  EXPECT_EQ(info.largest_free_block, static_cast<int64_t>(2 * kMiB));
  DataPtr whole = f.alloc->allocate(kMiB);  // the largest small request
  EXPECT_EQ(addr(whole), base);
  EXPECT_EQ(f.fake->raw_allocs, 1);

  // Large pool: a 30 MiB segment split 12 + 18; the 18 MiB remainder serves a 16 MiB request.
  Fixture g;
  DataPtr x = g.alloc->allocate(30 * kMiB);
  x.reset();
  DataPtr y = g.alloc->allocate(12 * kMiB);
  DataPtr z = g.alloc->allocate(16 * kMiB);
  EXPECT_EQ(g.fake->raw_allocs, 1);
  EXPECT_EQ(addr(z), addr(y) + 12 * kMiB);
  // 18 - 16 = 2 MiB > 1 MiB is split off again; a remainder of <= 1 MiB would not be.
  EXPECT_EQ(g.alloc->stats().current_bytes, static_cast<int64_t>(28 * kMiB));
}

// Out of memory: the first failure returns every cached segment and retries, which succeeds;
// when even that fails, td::Error names the request, allocated and reserved bytes.
TEST(CachingAllocator, OutOfMemoryFreesCacheThenThrows) {
  Fixture f;
  f.fake->capacity = 40 * kMiB;
  DataPtr keep = f.alloc->allocate(12 * kMiB);     // 12 MiB segment, live
  { DataPtr tmp = f.alloc->allocate(24 * kMiB); }  // 24 MiB segment, cached
  EXPECT_EQ(f.alloc->stats().reserved_bytes, static_cast<int64_t>(36 * kMiB));
  DataPtr p = f.alloc->allocate(26 * kMiB, 7);  // other stream: needs a fresh 26 MiB segment
  EXPECT_EQ(f.alloc->cache_info().oom_retries, 1);
  EXPECT_EQ(f.fake->raw_frees, 1);  // the cached 24 MiB went back
  EXPECT_EQ(f.alloc->stats().reserved_bytes, static_cast<int64_t>(38 * kMiB));

  // Both tries fail.
  f.fake->fail_next = 2;
  try {
    f.alloc->allocate(3000);
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tried to allocate 3000 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(38 * kMiB) + " bytes allocated"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(38 * kMiB) + " bytes reserved"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  }
  EXPECT_EQ(f.alloc->cache_info().oom_retries, 2);
  // The allocator is intact after the failure.
  MemoryStats s = f.alloc->stats();
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.current_bytes, static_cast<int64_t>(38 * kMiB));
  DataPtr ok = f.alloc->allocate(3000);
  EXPECT_NE(ok.get(), nullptr);
}

// Statistics are exact: allocated counts rounded block sizes, reserved counts segments, peak
// is the high-water mark of allocated until reset_peak.
TEST(CachingAllocator, StatsExact) {
  Fixture f;
  DataPtr a = f.alloc->allocate(1000);           // 1024
  DataPtr b = f.alloc->allocate(5000);           // 5120
  DataPtr c = f.alloc->allocate(12 * kMiB + 1);  // 12 MiB + 512, own 14 MiB segment
  MemoryStats s = f.alloc->stats();
  const int64_t big = static_cast<int64_t>(12 * kMiB + 512);
  EXPECT_EQ(s.current_bytes, 1024 + 5120 + big);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(2 * kMiB + 14 * kMiB));
  EXPECT_EQ(s.peak_bytes, s.current_bytes);
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.num_frees, 0);
  c.reset();
  s = f.alloc->stats();
  EXPECT_EQ(s.current_bytes, 1024 + 5120);
  EXPECT_EQ(s.peak_bytes, 1024 + 5120 + big);
  EXPECT_EQ(s.num_frees, 1);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(16 * kMiB));  // cached, still reserved
  f.alloc->reset_peak();
  EXPECT_EQ(f.alloc->stats().peak_bytes, 1024 + 5120);
  a.reset();
  b.reset();
  s = f.alloc->stats();
  EXPECT_EQ(s.current_bytes, 0);
  EXPECT_EQ(s.num_frees, 3);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(f.fake->live_bytes));
}

// empty_cache returns exactly the fully free segments to the backend and keeps those in use.
TEST(CachingAllocator, EmptyCacheReturnsSegments) {
  Fixture f;
  DataPtr live = f.alloc->allocate(100);
  { DataPtr t1 = f.alloc->allocate(12 * kMiB), t2 = f.alloc->allocate(200, 3); }
  EXPECT_EQ(f.alloc->cache_info().segments, 3);
  f.alloc->empty_cache();
  EXPECT_EQ(f.fake->raw_frees, 2);
  EXPECT_EQ(f.alloc->cache_info().segments, 1);
  EXPECT_EQ(f.alloc->stats().reserved_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(f.fake->live_bytes, 2 * kMiB);
  live.reset();
  f.alloc->empty_cache();
  EXPECT_EQ(f.fake->live_bytes, 0u);
  EXPECT_EQ(f.alloc->stats().reserved_bytes, 0);
}

// Note [Graph memory pools]: a retained stream's segments survive empty_cache() and the
// out-of-memory release even when every block in them is free (a captured graph still writes
// there); other streams' cached segments go as before; release_stream (as often as retained)
// makes them returnable again.
TEST(CachingAllocator, RetainedStreamKeepsItsSegments) {
  Fixture f;
  constexpr uint64_t kCapture = 77;
  f.alloc->retain_stream(kCapture);
  f.alloc->retain_stream(kCapture);
  { DataPtr a = f.alloc->allocate(12 * kMiB, kCapture), b = f.alloc->allocate(300, kCapture); }
  { DataPtr c = f.alloc->allocate(12 * kMiB, 5); }
  EXPECT_EQ(f.alloc->cache_info().segments, 3);
  f.alloc->empty_cache();
  EXPECT_EQ(f.alloc->cache_info().segments, 2);  // stream 5's went, the capture's stayed
  // Out of memory: only the free non-retained segments could go (none left), so it throws.
  f.fake->capacity = f.fake->live_bytes;
  EXPECT_THROW(f.alloc->allocate(30 * kMiB, 5), Error);
  EXPECT_EQ(f.alloc->cache_info().segments, 2);
  f.fake->capacity = SIZE_MAX;
  // A block freed on the retained stream is reused there, never on another stream.
  DataPtr again = f.alloc->allocate(12 * kMiB, kCapture);
  const int64_t raw = f.fake->raw_allocs;
  DataPtr other = f.alloc->allocate(12 * kMiB, 5);
  EXPECT_EQ(f.fake->raw_allocs, raw + 1);
  again.reset();
  other.reset();
  f.alloc->release_stream(kCapture);
  f.alloc->empty_cache();
  EXPECT_EQ(f.alloc->cache_info().segments, 2);  // still retained once
  f.alloc->release_stream(kCapture);
  f.alloc->empty_cache();
  EXPECT_EQ(f.alloc->cache_info().segments, 0);
  EXPECT_EQ(f.fake->live_bytes, 0u);
  EXPECT_THROW(f.alloc->release_stream(kCapture), Error);
}

// Randomized: live blocks never overlap, lie inside a live segment, and after freeing all of
// them every segment is one free block again (reserved == what the backend holds).
TEST(CachingAllocator, RandomizedNoOverlap) {
  Fixture f;
  std::mt19937 rng(123);
  std::vector<std::pair<DataPtr, size_t>> held;
  for (int step = 0; step < 3000; ++step) {
    if (held.empty() || rng() % 3 != 0) {
      size_t n = rng() % 4 == 0 ? rng() % (24 * kMiB) : rng() % 300000;
      DataPtr p = f.alloc->allocate(n, rng() % 2);
      held.emplace_back(std::move(p), CachingAllocator::round_size(n));
    } else {
      size_t i = rng() % held.size();
      std::swap(held[i], held.back());
      held.pop_back();
    }
    if (step % 100 == 0) {
      std::map<uintptr_t, size_t> spans;
      for (auto& [p, n] : held) spans[addr(p)] = n;
      uintptr_t end = 0;
      for (auto [a, n] : spans) {
        ASSERT_GE(a, end) << "overlapping blocks at step " << step;
        end = a + n;
        auto seg = f.fake->live.upper_bound(a);
        ASSERT_NE(seg, f.fake->live.begin());
        --seg;
        ASSERT_LE(a + n, seg->first + seg->second) << "block outside its segment";
      }
    }
  }
  held.clear();
  CacheInfo info = f.alloc->cache_info();
  EXPECT_EQ(info.free_blocks, info.segments);
  EXPECT_EQ(f.alloc->stats().current_bytes, 0);
  EXPECT_EQ(f.alloc->stats().reserved_bytes, static_cast<int64_t>(f.fake->live_bytes));
  f.alloc->empty_cache();
  EXPECT_EQ(f.fake->live_bytes, 0u);
}

// Two threads allocating and freeing at once (same stream and own streams) leave consistent
// statistics: every alloc matched by a free, nothing allocated, reserved equal to the backend.
TEST(CachingAllocator, ConcurrentAllocFree) {
  Fixture f;
  constexpr int kIters = 4000;
  auto work = [&](uint64_t seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::vector<DataPtr> held;
    for (int i = 0; i < kIters; ++i) {
      if (held.size() < 16 && rng() % 2 == 0) {
        size_t n = rng() % 8 == 0 ? rng() % (16 * kMiB) : rng() % 65536;
        held.push_back(f.alloc->allocate(n, rng() % 2 == 0 ? 0 : seed));
      } else if (!held.empty()) {
        held.erase(held.begin() + static_cast<long>(rng() % held.size()));
      }
    }
  };
  std::thread t1(work, 11), t2(work, 22);
  t1.join();
  t2.join();
  MemoryStats s = f.alloc->stats();
  EXPECT_GT(s.num_allocs, 0);
  EXPECT_EQ(s.num_allocs, s.num_frees);
  EXPECT_EQ(s.current_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, static_cast<int64_t>(f.fake->live_bytes));
  EXPECT_GE(s.peak_bytes, 512);
  f.alloc->empty_cache();
  EXPECT_EQ(f.fake->live_bytes, 0u);
  EXPECT_EQ(f.fake->raw_allocs, f.fake->raw_frees);
}

// A null backend is refused with a clear error.
TEST(CachingAllocator, RequiresBackend) {
  EXPECT_THROW(CachingAllocator(cuda_device(0), nullptr), Error);
}
