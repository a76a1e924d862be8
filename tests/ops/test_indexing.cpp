#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// Value of a row-major tensor (given as a flat vector) at a multi-index, with broadcasting:
// size-1 dims of `shape` are read at 0, and missing leading dims are ignored.
template <typename T>
T at_bcast(const std::vector<T>& v, const Shape& shape, const Shape& idx) {
  int64_t off = 0, lead = static_cast<int64_t>(idx.size() - shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t i = shape[d] == 1 ? 0 : idx[d + lead];
    off = off * shape[d] + i;
  }
  return v[off];
}

template <typename F>
void for_each_index(const Shape& shape, F f) {
  Shape idx(shape.size(), 0);
  for (int64_t n = 0; n < numel_of(shape); ++n) {
    f(idx);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

// ---------------- masked_fill ----------------

// masked_fill writes `value` exactly where the (broadcast) mask is true, on a transposed input,
// and the gradient passes only where the mask is false.
TEST(Indexing, MaskedFill) {
  Tensor x = randn_seeded({4, 3}, 1).t();  // [3, 4], non-contiguous
  Tensor mask = from_vector<bool>({true, false, false, true}, {4});
  Tensor y = masked_fill(x, mask, -1e9);
  auto xs = to_vector<float>(x), ys = to_vector<float>(y);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      bool m = j == 0 || j == 3;
      EXPECT_EQ(ys[i * 4 + j], m ? -1e9f : xs[i * 4 + j]);
    }
  }
  Tensor col = from_vector<bool>({false, true, false}, {3, 1});
  auto yc = to_vector<float>(masked_fill(x, col, 2.5));
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(yc[4 + j], 2.5f);
  EXPECT_EQ(yc[0], xs[0]);
  // Integer and bool inputs.
  Tensor xi = arange(0, 4);
  EXPECT_EQ(to_vector<int64_t>(masked_fill(xi, mask, 7)), (std::vector<int64_t>{7, 1, 2, 7}));
  // Gradient (finite differences) is zero exactly at masked positions.
  Tensor leaf = randn_seeded({3, 4}, 2).set_requires_grad(true);
  auto r = autograd::gradcheck([&](const TensorList& in) { return masked_fill(in[0], mask, 3.0); },
                               {leaf});
  EXPECT_TRUE(r.ok) << r.message;
  leaf.set_grad(Tensor());  // gradcheck left its own gradient there
  sum(masked_fill(leaf, mask, 3.0)).backward();
  auto g = to_vector<float>(leaf.grad());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(g[i], (i % 4 == 0 || i % 4 == 3) ? 0.0f : 1.0f);
}

TEST(Indexing, MaskedFillBadInput) {
  Tensor x = zeros({3, 4});
  EXPECT_THROW(masked_fill(x, ones({4}), 0.0), Error);  // not bool
  EXPECT_THROW(masked_fill(x, from_vector<bool>({true, false}, {2, 1}), 0.0), Error);
  EXPECT_THROW(masked_fill(x, from_vector<bool>({true, false}, {2, 1, 1}), 0.0), Error);
  EXPECT_NE(error_of([&] { masked_fill(x, ones({4}), 0.0); }).find("masked_fill"),
            std::string::npos);
}

// ---------------- where ----------------

// where broadcasts all three operands, promotes a/b, and its gradients are g masked by cond
// (a) / !cond (b), summed back over broadcast dims.
TEST(Indexing, Where) {
  Tensor cond = from_vector<bool>({true, false, true}, {3, 1});
  Tensor a = randn_seeded({1, 4}, 3), b = randn_seeded({4}, 4);
  Tensor y = where(cond, a, b);
  EXPECT_EQ(y.sizes(), (Shape{3, 4}));
  auto av = to_vector<float>(a), bv = to_vector<float>(b), yv = to_vector<float>(y);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(yv[i * 4 + j], i != 1 ? av[j] : bv[j]);
  }
  // Promotion: int32 with float32 -> float32; int32 with int64 -> int64.
  Tensor ai = from_vector<int32_t>({1, 2}, {2});
  Tensor bf = from_vector<float>({0.5f, 0.25f}, {2});
  Tensor c2 = from_vector<bool>({false, true}, {2});
  Tensor yp = where(c2, ai, bf);
  EXPECT_EQ(yp.dtype(), DType::Float32);
  EXPECT_EQ(to_vector<float>(yp), (std::vector<float>{0.5f, 2.0f}));
  EXPECT_EQ(where(c2, ai, from_vector<int64_t>({5, 6}, {2})).dtype(), DType::Int64);
  EXPECT_EQ(where(c2, bf.to(DType::BFloat16), bf).dtype(), DType::Float32);
  // Gradients of broadcast a and b.
  Tensor la = randn_seeded({1, 4}, 5).set_requires_grad(true),
         lb = randn_seeded({4}, 6).set_requires_grad(true);
  auto r = autograd::gradcheck([&](const TensorList& in) { return where(cond, in[0], in[1]); },
                               {la, lb});
  EXPECT_TRUE(r.ok) << r.message;
  la.set_grad(Tensor());  // gradcheck left its own gradients there
  lb.set_grad(Tensor());
  sum(where(cond, la, lb)).backward();
  EXPECT_EQ(to_vector<float>(la.grad()), std::vector<float>(4, 2.0f));  // two true rows
  EXPECT_EQ(to_vector<float>(lb.grad()), std::vector<float>(4, 1.0f));  // one false row
  // A transposed (non-contiguous) operand.
  Tensor at = randn_seeded({4, 3}, 7).t().set_requires_grad(true);
  auto r2 = autograd::gradcheck([&](const TensorList& in) { return where(cond, in[0], in[1]); },
                                {at, lb.detach().set_requires_grad(true)});
  EXPECT_TRUE(r2.ok) << r2.message;
}

TEST(Indexing, WhereBadInput) {
  Tensor a = zeros({3}), b = zeros({3});
  EXPECT_THROW(where(ones({3}), a, b), Error);  // cond not bool
  EXPECT_THROW(where(from_vector<bool>({true, false}, {2}), a, b), Error);
  EXPECT_THROW(where(from_vector<bool>({true}, {1}), a, zeros({2})), Error);
}

// ---------------- tril / triu ----------------

// tril keeps j - i <= k, triu keeps j - i >= k, over the last two dims of a batch, for
// several diagonals and a transposed input; the gradient is the same triangle of g.
TEST(Indexing, TrilTriu) {
  Tensor base = randn_seeded({2, 5, 4}, 8);
  Tensor x = base.transpose(1, 2);  // [2, 4, 5], non-contiguous
  auto xs = to_vector<float>(x);
  for (int64_t k : {-5, -2, -1, 0, 1, 3, 6}) {
    auto lo = to_vector<float>(tril(x, k)), up = to_vector<float>(triu(x, k));
    for_each_index(x.sizes(), [&](const Shape& ix) {
      int64_t off = (ix[0] * 4 + ix[1]) * 5 + ix[2];
      int64_t d = ix[2] - ix[1];
      ASSERT_EQ(lo[off], d <= k ? xs[off] : 0.0f) << "tril k=" << k;
      ASSERT_EQ(up[off], d >= k ? xs[off] : 0.0f) << "triu k=" << k;
    });
  }
  Tensor xi = arange(1, 10).view({3, 3});
  EXPECT_EQ(to_vector<int64_t>(tril(xi)), (std::vector<int64_t>{1, 0, 0, 4, 5, 0, 7, 8, 9}));
  EXPECT_EQ(to_vector<int64_t>(triu(xi, 1)), (std::vector<int64_t>{0, 2, 3, 0, 0, 6, 0, 0, 0}));
  Tensor leaf = randn_seeded({3, 4}, 9).set_requires_grad(true);
  sum(tril(leaf, 1)).backward();
  EXPECT_EQ(to_vector<float>(leaf.grad()),
            (std::vector<float>{1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}));
  auto r = autograd::gradcheck([](const TensorList& in) { return triu(in[0], -1); }, {leaf});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_THROW(tril(zeros({3})), Error);
  EXPECT_EQ(tril(zeros({2, 0, 3})).sizes(), (Shape{2, 0, 3}));
}

// ---------------- index_select / index_add ----------------

// index_select picks (possibly repeated) slices along each dim of a permuted input, with int32
// and int64 indices.
TEST(Indexing, IndexSelect) {
  Tensor x = randn_seeded({3, 4, 5}, 10).permute({2, 0, 1});  // [5, 3, 4]
  auto xs = to_vector<float>(x);
  std::vector<int64_t> iv = {2, 0, 2};
  for (DType it : {DType::Int64, DType::Int32}) {
    Tensor index = from_vector<int64_t>(iv, {3}).to(it);
    for (int64_t dim = 0; dim < 3; ++dim) {
      Tensor y = index_select(x, dim, index);
      Shape es = x.sizes();
      es[dim] = 3;
      ASSERT_EQ(y.sizes(), es);
      auto ys = to_vector<float>(y);
      int64_t n = 0;
      for_each_index(es, [&](const Shape& ix) {
        Shape src = ix;
        src[dim] = iv[ix[dim]];
        int64_t off = (src[0] * 3 + src[1]) * 4 + src[2];
        ASSERT_EQ(ys[n++], xs[off]);
      });
    }
  }
  EXPECT_EQ(index_select(x, -1, from_vector<int64_t>({}, {0})).sizes(), (Shape{5, 3, 0}));
}

// The gradient of index_select accumulates repeated indices (index_add) and matches finite
// differences; index_add itself is differentiable in both x and src.
TEST(Indexing, IndexSelectGradient) {
  Tensor index = from_vector<int64_t>({1, 3, 1, 1}, {4});
  Tensor x = randn_seeded({5, 3}, 11).set_requires_grad(true);
  sum(index_select(x, 0, index)).backward();
  EXPECT_EQ(to_vector<float>(x.grad()),
            (std::vector<float>{0, 0, 0, 3, 3, 3, 0, 0, 0, 1, 1, 1, 0, 0, 0}));
  Tensor xt = randn_seeded({3, 5}, 12).t().set_requires_grad(true);
  for (int64_t dim : {0, 1}) {
    Tensor idx = dim == 0 ? index : from_vector<int32_t>({2, 2, 0}, {3});
    auto r = autograd::gradcheck(
        [&](const TensorList& in) { return index_select(in[0], dim, idx); }, {xt});
    EXPECT_TRUE(r.ok) << r.message;
  }
  Tensor base = randn_seeded({5, 3}, 13).set_requires_grad(true);
  Tensor src = randn_seeded({4, 3}, 14).set_requires_grad(true);
  auto r = autograd::gradcheck(
      [&](const TensorList& in) { return index_add(in[0], 0, index, in[1]); }, {base, src});
  EXPECT_TRUE(r.ok) << r.message;
}

// index_add matches a serial double reference (repeated indices, middle dim).
TEST(Indexing, IndexAdd) {
  Tensor x = randn_seeded({2, 4, 3}, 15), src = randn_seeded({2, 5, 3}, 16);
  std::vector<int64_t> iv = {3, 0, 3, 3, 1};
  Tensor y = index_add(x, 1, from_vector<int64_t>(iv, {5}), src);
  auto xs = to_vector<float>(x), ss = to_vector<float>(src), ys = to_vector<float>(y);
  std::vector<double> want(xs.begin(), xs.end());
  for (int64_t o = 0; o < 2; ++o) {
    for (int64_t i = 0; i < 5; ++i) {
      for (int64_t c = 0; c < 3; ++c) want[(o * 4 + iv[i]) * 3 + c] += ss[(o * 5 + i) * 3 + c];
    }
  }
  for (size_t i = 0; i < ys.size(); ++i)
    EXPECT_NEAR(ys[i], want[i], 1e-6 * (1 + std::fabs(want[i])));
  // x itself is not modified.
  EXPECT_EQ(to_vector<float>(x), xs);
  Tensor xi = zeros({3}, {DType::Int32});
  Tensor yi =
      index_add(xi, 0, from_vector<int64_t>({2, 2}, {2}), from_vector<int32_t>({4, 5}, {2}));
  EXPECT_EQ(to_vector<int32_t>(yi), (std::vector<int32_t>{0, 0, 9}));
}

// bf16 index_add accumulates in fp32: 512 adds of 1 into one row give 512 (a bf16 running sum
// stalls at 256, where 256 + 1 rounds back to 256).
TEST(Indexing, IndexAddBf16AccumulatesInFp32) {
  Tensor x = zeros({2, 2}, {DType::BFloat16});
  Tensor src = ones({512, 2}, {DType::BFloat16});
  Tensor idx = zeros({512}, {DType::Int64});
  Tensor y = index_add(x, 0, idx, src);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  EXPECT_EQ(to_vector<float>(y), (std::vector<float>{512, 512, 0, 0}));
}

// Many repeated indices, large enough for the parallel path: bitwise identical results for 1
// and 2 threads (each output sums its contributions in index order).
TEST(Indexing, IndexAddDeterministicAcrossThreads) {
  Tensor src = randn_seeded({4000, 64}, 17);
  Generator g(18);
  Tensor idx = randint(0, 50, {4000}, {DType::Int64}, &g);
  Tensor x = zeros({50, 64});
  std::vector<float> a, b;
  int prev = omp_get_max_threads();
  omp_set_num_threads(1);
  a = to_vector<float>(index_add(x, 0, idx, src));
  omp_set_num_threads(2);
  b = to_vector<float>(index_add(x, 0, idx, src));
  omp_set_num_threads(prev);
  EXPECT_EQ(a, b);
}

// Out-of-range indices are errors that name the index value and the dim size.
TEST(Indexing, IndexBadInput) {
  Tensor x = zeros({4, 3});
  std::string msg = error_of([&] { index_select(x, 0, from_vector<int64_t>({1, 7}, {2})); });
  EXPECT_NE(msg.find("index_select"), std::string::npos) << msg;
  EXPECT_NE(msg.find("7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("size 4"), std::string::npos) << msg;
  EXPECT_THROW(index_select(x, 1, from_vector<int64_t>({-1}, {1})), Error);
  EXPECT_THROW(index_select(x, 0, from_vector<float>({0}, {1})), Error);
  EXPECT_THROW(index_select(x, 0, zeros({1, 1}, {DType::Int64})), Error);
  EXPECT_THROW(index_select(x, 2, from_vector<int64_t>({0}, {1})), Error);
  Tensor idx = from_vector<int64_t>({0, 1}, {2});
  EXPECT_THROW(index_add(x, 0, idx, zeros({3, 3})), Error);  // src length != index length
  EXPECT_THROW(index_add(x, 0, idx, zeros({2, 2})), Error);  // other dims differ
  EXPECT_THROW(index_add(x, 0, idx, zeros({2, 3}, {DType::Int64})), Error);  // dtype
  EXPECT_THROW(index_add(x, 0, from_vector<int64_t>({0, 4}, {2}), zeros({2, 3})), Error);
}
