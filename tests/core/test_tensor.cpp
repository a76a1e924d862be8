#include <gtest/gtest.h>

#include "tardelli/tardelli.h"

using namespace td;

// Views share storage and compose strides without copying.
TEST(Tensor, ViewsShareStorage) {
  Tensor a = arange(0, 24, 1, {DType::Float32}).view({2, 3, 4});
  Tensor t = a.transpose(0, 2);
  EXPECT_EQ(t.sizes(), (Shape{4, 3, 2}));
  EXPECT_TRUE(t.shares_storage(a));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_FLOAT_EQ(t.select(0, 3).select(0, 2).select(0, 1).item<float>(), 23.0f);
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage(a));
  EXPECT_EQ(to_vector<float>(c), to_vector<float>(t));
}

// As in torch, a tensor without elements is contiguous whatever its strides: ops that require
// a contiguous output accept a freshly allocated empty one (the CUDA tril of an empty matrix
// failed that check before).
TEST(Tensor, EmptyTensorsAreContiguous) {
  Tensor e = Tensor::empty({2, 0, 5}, DType::Float32, kCPU);
  EXPECT_TRUE(e.is_contiguous());
  EXPECT_TRUE(e.transpose(0, 2).is_contiguous());
  EXPECT_TRUE(tril(zeros({3, 0, 4})).is_contiguous());
  EXPECT_FALSE(zeros({2, 3}).transpose(0, 1).is_contiguous());
}

TEST(Tensor, BadViewIsAnError) {
  Tensor a = zeros({4, 6});
  EXPECT_THROW(a.view({5, 5}), Error);
  EXPECT_THROW(a.transpose(0, 1).view({24}), Error);
  EXPECT_NO_THROW(a.transpose(0, 1).reshape({24}));
}

// The CPU allocator aligns to 64 bytes and tracks current and peak bytes.
TEST(Allocator, AlignmentAndStats) {
  reset_peak_memory_stats();
  int64_t before = memory_stats().current_bytes;
  {
    Tensor t = empty({1000});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
    EXPECT_GE(memory_stats().current_bytes - before, 4000);
  }
  EXPECT_EQ(memory_stats().current_bytes, before);
  EXPECT_GE(memory_stats().peak_bytes - before, 4000);
}

// Autograd: y = sum(a * b + a) -> dy/da = b + 1, dy/db = a.
TEST(Autograd, SimpleGraph) {
  Tensor a = from_vector<float>({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor b = from_vector<float>({4, 5, 6}, {3}).set_requires_grad(true);
  Tensor y = sum(add(mul(a, b), a));
  y.backward();
  EXPECT_EQ(to_vector<float>(a.grad()), (std::vector<float>{5, 6, 7}));
  EXPECT_EQ(to_vector<float>(b.grad()), (std::vector<float>{1, 2, 3}));
}

// Large blocks are cached and reused (same size class -> same block), counted as reserved but
// not as current; empty_cache returns them. See Note [CPU caching allocator].
TEST(Allocator, CachesLargeBlocks) {
  empty_cache();
  void* first = nullptr;
  {
    Tensor t = empty({1 << 20});  // 4 MiB
    first = t.data_ptr();
  }
  MemoryStats s = memory_stats();
  EXPECT_GE(s.reserved_bytes - s.current_bytes, 4 << 20);
  {
    Tensor t = empty({(1 << 20) - 100});  // same size class
    EXPECT_EQ(t.data_ptr(), first);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  }
  empty_cache();
  s = memory_stats();
  EXPECT_EQ(s.reserved_bytes, s.current_bytes);
}

// Property (Note [Released storage]): releasing a storage returns its bytes to the allocator
// while every tensor viewing it stays a valid handle; reading one is a td::Error that says the
// storage is released; materialize() gives the same storage fresh bytes of the same size,
// visible through every view, and refill() can install bytes owned elsewhere.
TEST(Tensor, ReleasedStorageFreesBytesAndRefills) {
  Tensor a = zeros({1000});
  Tensor v = a.narrow(0, 10, 5);
  const int64_t before = memory_stats().current_bytes;
  a.storage().release();
  EXPECT_TRUE(a.storage().released());
  EXPECT_LE(memory_stats().current_bytes, before - 4000);
  try {
    (void)to_vector<float>(v);
    FAIL() << "expected a td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("released"), std::string::npos) << e.what();
  }
  a.storage().materialize();
  EXPECT_FALSE(a.storage().released());
  EXPECT_GE(memory_stats().current_bytes, before);
  a.fill_(2.0);
  EXPECT_EQ(sum(v).item<float>(), 10.0f);
  Tensor owner = full({1000}, 3.0);
  a.storage().refill(DataPtr(owner.data_ptr(), [keep = owner](void*) {}));
  EXPECT_EQ(sum(v).item<float>(), 15.0f);
  owner.fill_(1.0);  // the same bytes
  EXPECT_EQ(sum(v).item<float>(), 5.0f);
}
