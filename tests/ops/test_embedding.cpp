#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::test::randn_seeded;

// The lookup copies weight rows exactly (a gather: bitwise equal), for int64 and int32
// indices of any shape (here [2, 3] -> output [2, 3, D]), and from a strided weight.
TEST(Embedding, GathersRows) {
  Tensor w = randn_seeded({7, 5}, 1);
  std::vector<float> wv = to_vector<float>(w);
  std::vector<int64_t> idx = {3, 0, 6, 3, 1, 1};
  for (DType it : {DType::Int64, DType::Int32}) {
    Tensor ind = from_vector<int64_t>(idx, {2, 3}).to(it);
    Tensor out = embedding(w, ind);
    EXPECT_EQ(out.sizes(), (Shape{2, 3, 5}));
    std::vector<float> ov = to_vector<float>(out);
    for (size_t i = 0; i < idx.size(); ++i) {
      for (int j = 0; j < 5; ++j) ASSERT_EQ(ov[i * 5 + j], wv[idx[i] * 5 + j]) << i << "," << j;
    }
  }
  Tensor wt = randn_seeded({5, 7}, 2).t();  // [7, 5] strided weight
  Tensor out = embedding(wt, from_vector<int64_t>({4, 2}, {2}));
  std::vector<float> wtv = to_vector<float>(wt), ov = to_vector<float>(out);
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(ov[j], wtv[4 * 5 + j]);
    EXPECT_EQ(ov[5 + j], wtv[2 * 5 + j]);
  }
  // bf16 weights are copied as bf16 (no conversion).
  Tensor wb = w.to(DType::BFloat16);
  EXPECT_EQ(to_vector<float>(embedding(wb, from_vector<int64_t>({6}, {1}))),
            to_vector<float>(wb.select(0, 6)));
}

// The backward sums the grad rows of repeated indices (exactly, for small integers in fp32)
// and leaves unused rows zero; through autograd the weight gets that gradient.
TEST(Embedding, BackwardScatterAdds) {
  std::vector<int64_t> idx = {2, 0, 2, 2, 4};
  Tensor ind = from_vector<int64_t>(idx, {5});
  std::vector<float> gv(5 * 3);
  for (size_t i = 0; i < gv.size(); ++i) gv[i] = static_cast<float>(i);
  Tensor g = from_vector<float>(gv, {5, 3});
  std::vector<double> want(6 * 3, 0.0);
  for (size_t i = 0; i < idx.size(); ++i) {
    for (int j = 0; j < 3; ++j) want[idx[i] * 3 + j] += gv[i * 3 + j];
  }
  Tensor dw = embedding_backward(g, ind, 6);
  EXPECT_EQ(dw.sizes(), (Shape{6, 3}));
  std::vector<float> got = to_vector<float>(dw);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;

  Tensor w = randn_seeded({6, 3}, 3).set_requires_grad(true);
  embedding(w, ind.to(DType::Int32)).backward(g);
  EXPECT_EQ(to_vector<float>(w.grad()), got);
}

// Gradcheck of the lookup w.r.t. the weight, indices of rank 2 with repeats.
TEST(Embedding, Gradcheck) {
  Tensor w = randn_seeded({5, 4}, 4).set_requires_grad(true);
  Tensor ind = from_vector<int64_t>({1, 4, 1, 0, 1, 3}, {3, 2});
  auto r = autograd::gradcheck([ind](const TensorList& in) { return embedding(in[0], ind); }, {w});
  EXPECT_TRUE(r.ok) << r.message;
}

// Many repeats of a few rows in a large batch: the result equals a sequential double-free
// reference bit for bit (same summation order: positions in increasing order), so it cannot
// depend on how vocab rows were split across threads. bf16 grads accumulate in fp32 and round
// once: checked against the fp32 sum rounded to bf16.
TEST(Embedding, BackwardIsDeterministicInIndexOrder) {
  const int64_t n = 4096, V = 50, D = 96;
  Generator gen(5);
  Tensor ind = randint(0, V, {n}, {DType::Int64, kCPU, false}, &gen);
  Tensor g = randn({n, D}, {}, &gen);
  std::vector<int64_t> iv = to_vector<int64_t>(ind);
  std::vector<float> gv = to_vector<float>(g);
  std::vector<float> want(V * D, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < D; ++j) want[iv[i] * D + j] += gv[i * D + j];
  }
  EXPECT_EQ(to_vector<float>(embedding_backward(g, ind, V)), want);

  Tensor gb = g.to(DType::BFloat16);
  std::vector<float> gbv = to_vector<float>(gb);
  std::vector<float> wantb(V * D, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < D; ++j) wantb[iv[i] * D + j] += gbv[i * D + j];
  }
  Tensor db = embedding_backward(gb, ind, V);
  EXPECT_EQ(db.dtype(), DType::BFloat16);
  std::vector<float> got = to_vector<float>(db);
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k], static_cast<float>(BFloat16(wantb[k]))) << k;
  }
}

// Out-of-range indices (too large or negative) are td::Errors that name the index and
// num_embeddings; float indices and a non-2-D weight are rejected too.
TEST(Embedding, BadInputErrors) {
  Tensor w = zeros({10, 4});
  try {
    embedding(w, from_vector<int64_t>({1, 12, 3}, {3}));
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("index 12"), std::string::npos) << m;
    EXPECT_NE(m.find("num_embeddings 10"), std::string::npos) << m;
  }
  EXPECT_THROW(embedding(w, from_vector<int32_t>({-1}, {1})), Error);
  EXPECT_THROW(embedding(w, zeros({2})), Error);
  EXPECT_THROW(embedding(zeros({10}), from_vector<int64_t>({1}, {1})), Error);
  EXPECT_THROW(embedding_backward(zeros({3, 4}), from_vector<int64_t>({1, 2}, {2}), 10), Error);
  EXPECT_THROW(embedding_backward(zeros({1, 4}), from_vector<int64_t>({10}, {1}), 10), Error);
}
