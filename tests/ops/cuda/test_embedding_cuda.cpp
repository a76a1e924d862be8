// embedding / embedding_backward on CUDA against the CPU backend. The lookup copies bytes and
// the backward adds each vocab row's gradient rows in token order in fp32 on both backends
// (Note [CUDA embedding backward]), so every comparison here is bitwise, for every dtype.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

// Indices in [0, high) as `dt`, on the CPU.
Tensor random_indices(const Shape& shape, int64_t high, uint64_t seed, DType dt = DType::Int64) {
  Generator gen(seed);
  Tensor t = randint(0, high, shape, {DType::Int64, kCPU, false}, &gen);
  return dt == DType::Int64 ? t : t.to(dt);
}

// CUDA result (moved back) and CPU result have the same dtype, shape and bytes.
void expect_same(const Tensor& cuda_result, const Tensor& cpu_result, const std::string& what) {
  ASSERT_TRUE(cuda_result.is_cuda()) << what;
  EXPECT_TRUE(same_bytes(on_cpu(cuda_result), cpu_result)) << what;
}

}  // namespace

TEST(EmbeddingCuda, ForwardMatchesCpuBitwise) {
  TD_REQUIRE_CUDA();
  // Row sizes that allow 16-, 8-, 4- and 2-byte copies.
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (int64_t D : {1, 2, 3, 4, 8, 64, 771}) {
      for (DType it : {DType::Int64, DType::Int32}) {
        const int64_t V = 37;
        Tensor w = randn_seeded({V, D}, 11 + D, dt);
        Tensor idx = random_indices({5, 7}, V, 3 + D, it);
        std::string what =
            std::string(dtype_name(dt)) + " D=" + std::to_string(D) + " " + dtype_name(it);
        expect_same(embedding(on_cuda(w), on_cuda(idx)), embedding(w, idx), what);
      }
    }
  }
}

TEST(EmbeddingCuda, ForwardIntegerWeightsAndOneRow) {
  TD_REQUIRE_CUDA();
  Tensor w = random_indices({9, 5}, 1000, 1);  // int64 table: copied as bytes as well
  Tensor idx = from_vector<int64_t>({8, 0, 8}, {3});
  expect_same(embedding(on_cuda(w), on_cuda(idx)), embedding(w, idx), "int64 weight");
  Tensor w1 = randn_seeded({1, 6}, 2);
  Tensor i1 = from_vector<int64_t>({0}, {1});
  expect_same(embedding(on_cuda(w1), on_cuda(i1)), embedding(w1, i1), "one row");
}

TEST(EmbeddingCuda, ForwardNonContiguousInputs) {
  TD_REQUIRE_CUDA();
  // weight = the transpose of a [D, V] tensor; indices = the transpose of a [4, 6] tensor.
  Tensor wt = randn_seeded({12, 40}, 5);
  Tensor it = random_indices({4, 6}, 40, 6);
  Tensor w_cuda = on_cuda(wt).transpose(0, 1);
  Tensor i_cuda = on_cuda(it).transpose(0, 1);
  ASSERT_FALSE(w_cuda.is_contiguous());
  expect_same(embedding(w_cuda, i_cuda), embedding(wt.transpose(0, 1), it.transpose(0, 1)),
              "transposed");
  // A weight view that starts one element into its storage: rows not 16-byte aligned.
  Tensor big = randn_seeded({40 * 8 + 1}, 7);
  Tensor w_off = big.narrow(0, 1, 40 * 8).view({40, 8});
  Tensor w_off_cuda = on_cuda(big).narrow(0, 1, 40 * 8).view({40, 8});
  Tensor idx = random_indices({13}, 40, 8);
  expect_same(embedding(w_off_cuda, on_cuda(idx)), embedding(w_off, idx), "offset weight");
}

TEST(EmbeddingCuda, EmptyIndices) {
  TD_REQUIRE_CUDA();
  Tensor w = on_cuda(randn_seeded({10, 4}, 1));
  Tensor out = embedding(w, on_cuda(Tensor::empty({2, 0}, DType::Int64)));
  EXPECT_EQ(out.sizes(), (Shape{2, 0, 4}));
  Tensor g = on_cuda(Tensor::empty({0, 4}));
  Tensor dw = embedding_backward(g, on_cuda(Tensor::empty({0}, DType::Int64)), 10);
  EXPECT_EQ(dw.sizes(), (Shape{10, 4}));
  EXPECT_EQ(to_vector<float>(on_cpu(dw)), std::vector<float>(40, 0.0f));
}

TEST(EmbeddingCuda, BackwardRepeatedIndicesBitwise) {
  TD_REQUIRE_CUDA();
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (DType it : {DType::Int64, DType::Int32}) {
      // 5000 tokens over a vocab of 50 where most tokens hit 5 rows: long segments whose sum
      // depends on the order of addition; 129 columns (not a multiple of the block).
      const int64_t V = 50, D = 129;
      Tensor hot = random_indices({4000}, 5, 21, it);
      Tensor cold = random_indices({1000}, V, 22, it);
      Tensor idx = cat({hot, cold}, 0).view({50, 100});
      Tensor g = randn_seeded({50, 100, D}, 23, dt);
      Tensor want = embedding_backward(g, idx, V);
      Tensor got = embedding_backward(on_cuda(g), on_cuda(idx), V);
      std::string what = std::string(dtype_name(dt)) + " " + dtype_name(it);
      expect_same(got, want, what);
      // The same again: no dependence on timing.
      EXPECT_TRUE(same_bytes(on_cpu(got), on_cpu(embedding_backward(on_cuda(g), on_cuda(idx), V))))
          << what;
    }
  }
}

TEST(EmbeddingCuda, BackwardLargeVocabAndManyTokens) {
  TD_REQUIRE_CUDA();
  // Most vocab rows get no token (written as zeros); 2^18 + 5 tokens; one vocab row.
  {
    const int64_t V = 100000, D = 24;
    Tensor idx = random_indices({777}, V, 31);
    Tensor g = randn_seeded({777, D}, 32);
    expect_same(embedding_backward(on_cuda(g), on_cuda(idx), V), embedding_backward(g, idx, V),
                "sparse");
  }
  {
    const int64_t V = 1000, D = 64, n = (1 << 18) + 5;
    Tensor idx = random_indices({n}, V, 33, DType::Int32);
    Tensor g = randn_seeded({n, D}, 34);
    expect_same(embedding_backward(on_cuda(g), on_cuda(idx), V), embedding_backward(g, idx, V),
                "many tokens");
  }
  {
    Tensor idx = from_vector<int64_t>({0, 0, 0}, {3});
    Tensor g = randn_seeded({3, 5}, 35);
    expect_same(embedding_backward(on_cuda(g), on_cuda(idx), 1), embedding_backward(g, idx, 1),
                "one row");
  }
}

TEST(EmbeddingCuda, BackwardNonContiguousGrad) {
  TD_REQUIRE_CUDA();
  Tensor idx = random_indices({6, 9}, 20, 41);
  Tensor gt = randn_seeded({6, 16, 9}, 42);  // grad = transpose(1, 2) of this: [6, 9, 16]
  expect_same(embedding_backward(on_cuda(gt).transpose(1, 2), on_cuda(idx), 20),
              embedding_backward(gt.transpose(1, 2), idx, 20), "transposed grad");
}

TEST(EmbeddingCuda, AutogradMatchesCpu) {
  TD_REQUIRE_CUDA();
  const int64_t V = 30, D = 17;
  Tensor w_cpu = randn_seeded({V, D}, 51);
  w_cpu.set_requires_grad(true);
  Tensor w_cuda = on_cuda(randn_seeded({V, D}, 51));
  w_cuda.set_requires_grad(true);
  Tensor idx = random_indices({8, 11}, 7, 52);  // many repeats
  Tensor g = randn_seeded({8, 11, D}, 53);
  embedding(w_cpu, idx).backward(g);
  embedding(w_cuda, on_cuda(idx)).backward(on_cuda(g));
  ASSERT_TRUE(w_cuda.grad().defined());
  expect_same(w_cuda.grad(), w_cpu.grad(), "weight grad");
}

TEST(EmbeddingCuda, BadInputsRaise) {
  TD_REQUIRE_CUDA();
  Tensor w = on_cuda(randn_seeded({10, 4}, 1));
  // Out of range: the first bad position and its value are named, as on the CPU, at the next
  // read of device memory to the host (Note [Deferred device checks]); meanwhile the bad rows
  // gather zeros and their gradient rows are dropped, so no kernel reads out of bounds.
  for (DType it : {DType::Int64, DType::Int32}) {
    Tensor bad = on_cuda(from_vector<int64_t>({1, 2, 10, -1}, {4}).to(it));
    Tensor out;
    ASSERT_NO_THROW(out = embedding(w, bad));
    std::string msg = error_of([&] { out.to(kCPU); });
    EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 10 at position 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("deferred device check"), std::string::npos) << msg;
    // The check is gone; the good rows were gathered, the bad ones are zeros.
    const Tensor host = out.to(kCPU);
    EXPECT_TRUE(same_bytes(host.narrow(0, 0, 2), w.to(kCPU).narrow(0, 1, 2)));
    EXPECT_EQ(max(abs(host.narrow(0, 2, 2))).item_double(), 0.0);
    Tensor neg = on_cuda(from_vector<int64_t>({-3}, {1}).to(it));
    msg = error_of([&] { embedding(w, neg).to(kCPU); });
    EXPECT_NE(msg.find("index -3 at position 0"), std::string::npos) << msg;
    Tensor g = on_cuda(ones({4, 4}));
    Tensor dw;
    ASSERT_NO_THROW(dw = embedding_backward(g, bad, 10));
    msg = error_of([&] { cuda_synchronize(0); });
    EXPECT_NE(msg.find("embedding_backward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 10 at position 2"), std::string::npos) << msg;
    // Rows 1 and 2 got their one gradient row each; the bad rows added nothing anywhere.
    const Tensor dh = dw.to(kCPU);
    EXPECT_EQ(sum(dh).item_double(), 8.0);
    EXPECT_EQ(sum(dh.narrow(0, 1, 2)).item_double(), 8.0);
  }
  // Indices on another device, float indices, a 1-D weight, a grad of the wrong shape.
  EXPECT_THROW(embedding(w, from_vector<int64_t>({1}, {1})), Error);
  EXPECT_THROW(embedding(w, on_cuda(zeros({2}))), Error);
  EXPECT_THROW(embedding(on_cuda(zeros({4})), on_cuda(from_vector<int64_t>({1}, {1}))), Error);
  EXPECT_THROW(
      embedding_backward(on_cuda(zeros({3, 4})), on_cuda(from_vector<int64_t>({1, 2}, {2})), 10),
      Error);
  EXPECT_THROW(embedding_backward(on_cuda(zeros({2, 4})), from_vector<int64_t>({1, 2}, {2}), 10),
               Error);
}
