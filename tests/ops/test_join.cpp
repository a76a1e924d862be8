#include <gtest/gtest.h>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

// cat along each dim equals the pieces read back with narrow, for a mix of contiguous and
// transposed inputs (including a piece of size 0 along the cat dim).
TEST(Join, CatMatchesPieces) {
  Tensor a = randn_seeded({2, 3, 4}, 1);
  Tensor b = randn_seeded({4, 3, 2}, 2).transpose(0, 2);  // [2, 3, 4] non-contiguous
  for (int64_t dim = 0; dim < 3; ++dim) {
    Shape es = a.sizes();
    es[dim] = 0;
    Tensor e = zeros(es);
    Tensor y = cat({a, e, b}, dim);
    Shape ys = a.sizes();
    ys[dim] *= 2;
    ASSERT_EQ(y.sizes(), ys);
    EXPECT_EQ(to_vector<float>(narrow(y, dim, 0, a.size(dim))), to_vector<float>(a));
    EXPECT_EQ(to_vector<float>(narrow(y, dim, a.size(dim), b.size(dim))), to_vector<float>(b));
  }
  EXPECT_EQ(to_vector<float>(cat({a, b}, -1)), to_vector<float>(cat({a, b}, 2)));
  // Integer and bf16 dtypes keep their dtype.
  Tensor i = cat({arange(0, 2), arange(5, 7)});
  EXPECT_EQ(to_vector<int64_t>(i), (std::vector<int64_t>{0, 1, 5, 6}));
  EXPECT_EQ(cat({a.to(DType::BFloat16), b.to(DType::BFloat16)}, 1).dtype(), DType::BFloat16);
}

// Empty tensors: all-empty results, and torch's legacy 1-D size-0 tensors that are skipped
// regardless of the other tensors' rank.
TEST(Join, CatEmpty) {
  Tensor a = randn_seeded({2, 3}, 3);
  EXPECT_EQ(cat({zeros({0, 3}), zeros({0, 3})}).sizes(), (Shape{0, 3}));
  Tensor y = cat({zeros({0}), a, zeros({0})}, 1);
  EXPECT_EQ(y.sizes(), (Shape{2, 3}));
  EXPECT_EQ(to_vector<float>(y), to_vector<float>(a));
  EXPECT_EQ(cat({zeros({0}), zeros({0})}).sizes(), (Shape{0}));
  Tensor leaf = randn_seeded({2, 3}, 4).set_requires_grad(true);
  Tensor e = zeros({0}).set_requires_grad(true);
  sum(cat({e, leaf}, 0)).backward();
  EXPECT_EQ(to_vector<float>(leaf.grad()), std::vector<float>(6, 1.0f));
  EXPECT_EQ(e.grad().sizes(), (Shape{0}));
}

// The gradient of cat is the grad sliced per input (finite differences, 3 inputs, dims 0/1).
TEST(Join, CatGradient) {
  Tensor a = randn_seeded({2, 3}, 5).set_requires_grad(true);
  Tensor b = randn_seeded({3, 2}, 6).t().set_requires_grad(true);  // [2, 3] transposed leaf
  Tensor c = randn_seeded({2, 1}, 7).set_requires_grad(true);
  auto r0 = autograd::gradcheck(
      [](const TensorList& in) {
        return cat({in[0], in[1]}, 0);
      },
      {a, b});
  EXPECT_TRUE(r0.ok) << r0.message;
  auto r1 = autograd::gradcheck(
      [](const TensorList& in) {
        return cat({in[0], in[1], in[2]}, 1);
      },
      {a, b, c});
  EXPECT_TRUE(r1.ok) << r1.message;
  // Only the inputs that require grad get one.
  Tensor d = randn_seeded({2, 3}, 8);
  a.set_grad(Tensor());
  Tensor w = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {4, 3});
  sum(mul(cat({d, a}, 0), w)).backward();
  EXPECT_EQ(to_vector<float>(a.grad()), (std::vector<float>{7, 8, 9, 10, 11, 12}));
  EXPECT_FALSE(d.grad().defined());
}

TEST(Join, CatBadInput) {
  Tensor a = zeros({2, 3});
  std::string m = error_of([&] { cat({a, zeros({2, 4})}, 0); });
  EXPECT_NE(m.find("cat"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("dim 1"), std::string::npos) << m;
  std::string md = error_of([&] { cat({a, zeros({2, 3}, {DType::BFloat16})}, 0); });
  EXPECT_NE(md.find("bfloat16"), std::string::npos) << md;
  EXPECT_THROW(cat({}, 0), Error);
  EXPECT_THROW(cat({a, zeros({2, 3, 1})}, 0), Error);
  EXPECT_THROW(cat({a, a}, 2), Error);
  EXPECT_THROW(cat({scalar_tensor(1.0), scalar_tensor(2.0)}), Error);
  EXPECT_THROW(cat({a, Tensor()}), Error);
}

// stack inserts a new dim at any position (including the end and negative positions).
TEST(Join, Stack) {
  Tensor a = randn_seeded({2, 3}, 9), b = randn_seeded({2, 3}, 10);
  auto av = to_vector<float>(a), bv = to_vector<float>(b);
  Tensor s0 = stack({a, b}, 0);
  EXPECT_EQ(s0.sizes(), (Shape{2, 2, 3}));
  EXPECT_EQ(to_vector<float>(s0.select(0, 1)), bv);
  Tensor s2 = stack({a, b}, -1);
  EXPECT_EQ(s2.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(to_vector<float>(s2.select(2, 0)), av);
  EXPECT_EQ(to_vector<float>(s2.select(2, 1)), bv);
  Tensor la = a.detach().set_requires_grad(true),
         lb = b.t().contiguous().t().set_requires_grad(true);
  auto r = autograd::gradcheck(
      [](const TensorList& in) {
        return stack({in[0], in[1]}, 1);
      },
      {la, lb});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_THROW(stack({a, zeros({3, 2})}), Error);
  EXPECT_THROW(stack({a, b}, 3), Error);
  EXPECT_THROW(stack({}), Error);
}

// split/chunk return views (no copy) that tile the input; they are differentiable.
TEST(Join, SplitAndChunk) {
  Tensor x = randn_seeded({7, 4}, 11);
  auto pieces = split(x, 3, 0);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].sizes(), (Shape{3, 4}));
  EXPECT_EQ(pieces[2].sizes(), (Shape{1, 4}));
  for (const auto& p : pieces) EXPECT_TRUE(p.shares_storage(x));
  EXPECT_EQ(to_vector<float>(cat(pieces, 0)), to_vector<float>(x));
  auto by = split(x, Shape{1, 0, 3}, 1);
  ASSERT_EQ(by.size(), 3u);
  EXPECT_EQ(by[1].sizes(), (Shape{7, 0}));
  EXPECT_EQ(to_vector<float>(cat(by, 1)), to_vector<float>(x));
  // chunk: pieces of ceil(n / chunks) (torch), so 7 rows in 3 chunks are 3, 3, 1 and
  // 6 columns in 4 chunks are 2, 2, 2.
  auto c = chunk(x, 3, 0);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2].size(0), 1);
  auto c2 = chunk(zeros({2, 6}), 4, 1);
  ASSERT_EQ(c2.size(), 3u);
  EXPECT_EQ(c2[0].size(1), 2);
  EXPECT_EQ(split(zeros({0, 2}), 2, 0).size(), 1u);
  // Gradient through a split piece lands in the right rows.
  Tensor leaf = randn_seeded({7, 4}, 12).set_requires_grad(true);
  auto ps = split(leaf, 3, 0);
  sum(ps[1]).backward();
  auto g = to_vector<float>(leaf.grad());
  for (int64_t i = 0; i < 28; ++i) EXPECT_EQ(g[i], (i >= 12 && i < 24) ? 1.0f : 0.0f);
  auto r = autograd::gradcheck([](const TensorList& in) { return chunk(in[0], 2, 1)[1]; },
                               {randn_seeded({4, 3}, 13).t().set_requires_grad(true)});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_THROW(split(x, 0, 0), Error);
  EXPECT_THROW(split(x, Shape{3, 3}, 0), Error);
  EXPECT_THROW(split(x, Shape{8, -1}, 0), Error);
  EXPECT_THROW(chunk(x, 0, 0), Error);
  EXPECT_THROW(split(scalar_tensor(1.0), 1, 0), Error);
}

// split's pieces share one backward node (Note [Split backward]): they are views of the input,
// and the input's gradient holds each piece's gradient in its place and zeros where a piece got
// none, exactly as the separate narrows' gradients summed would.
TEST(Join, SplitBackwardWritesEachPieceInPlace) {
  Tensor x = randn({3, 10, 7}).set_requires_grad(true);
  TensorList parts = split(x, Shape{2, 5, 3}, 1);
  ASSERT_EQ(parts.size(), 3u);
  for (const Tensor& p : parts) EXPECT_TRUE(p.shares_storage(x));
  Tensor g0 = randn({3, 2, 7}), g2 = randn({3, 3, 7});
  // The middle piece takes no part in the loss: its slice of the gradient must be zero.
  add(sum(mul(parts[0], g0)), sum(mul(parts[2], g2))).backward();
  Tensor gx = x.grad();
  EXPECT_EQ(sum(ne(gx.narrow(1, 0, 2), g0)).item<int64_t>(), 0);
  EXPECT_EQ(sum(abs(gx.narrow(1, 2, 5))).item<float>(), 0.0f);
  EXPECT_EQ(sum(ne(gx.narrow(1, 7, 3), g2)).item<int64_t>(), 0);
  // Equal-size pieces (the last shorter) and a gradient check through a non-linear use.
  Tensor y = randn({2, 9}).set_requires_grad(true);
  auto r = autograd::gradcheck(
      [](const TensorList& in) {
        TensorList p = split(in[0], 4, 1);
        return add(sum(mul(p[0], p[0])), mul(sum(p[2]), 3.0));
      },
      {y});
  EXPECT_TRUE(r.ok) << r.message;
}
