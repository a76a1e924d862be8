#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// RoPE in double from the definition: angle(t, i) = (start + t) * base^(-2i/D), rotate-half.
std::vector<double> ref_rope(const std::vector<double>& x, int64_t B, int64_t T, int64_t H,
                             int64_t D, double base, int64_t start, bool inverse) {
  std::vector<double> y(x.size());
  int64_t half = D / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        int64_t o = ((b * T + t) * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          double a = (start + t) * std::pow(base, -2.0 * i / D) * (inverse ? -1 : 1);
          double x1 = x[o + i], x2 = x[o + i + half];
          y[o + i] = x1 * std::cos(a) - x2 * std::sin(a);
          y[o + i + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
    }
  }
  return y;
}

}  // namespace

// The cache holds cos/sin of (start + t) * base^(-2i/D), fp32 [T, D/2]; angles are formed in
// double, so even at position 5000 the tables are within fp32 rounding (1e-6) of the truth.
TEST(Rotary, CacheValues) {
  auto [c, s] = rope_cache(8, 16, 10000.0, 5000);
  EXPECT_EQ(c.sizes(), (Shape{8, 8}));
  EXPECT_EQ(s.dtype(), DType::Float32);
  std::vector<double> cv = doubles(c), sv = doubles(s);
  for (int t = 0; t < 8; ++t) {
    for (int i = 0; i < 8; ++i) {
      double a = (5000 + t) * std::pow(10000.0, -2.0 * i / 16);
      ASSERT_NEAR(cv[t * 8 + i], std::cos(a), 1e-6);
      ASSERT_NEAR(sv[t * 8 + i], std::sin(a), 1e-6);
    }
  }
}

// apply_rotary matches the definition on a contiguous x and on a strided x (a [B, H, T, D]
// tensor transposed to [B, T, H, D], and a slice of the head dim with stride 2); fp32
// products of O(1) values: 1e-6 absolute. The inverse kernel undoes the rotation.
TEST(Rotary, MatchesDoubleReference) {
  const int64_t B = 2, T = 5, H = 3, D = 8;
  auto [c, s] = rope_cache(T, D, 10000.0, 2);
  Tensor xa = randn_seeded({B, T, H, D}, 1);
  Tensor xb = randn_seeded({B, H, T, D}, 2).transpose(1, 2);
  Tensor xc = randn_seeded({B, T, H, 2 * D}, 3).slice(3, 0, 2 * D, 2);
  ASSERT_FALSE(xb.is_contiguous());
  ASSERT_EQ(xc.stride(3), 2);
  for (const Tensor& x : {xa, xb, xc}) {
    std::vector<double> xd = doubles(x);
    Tensor y = apply_rotary(x, c, s);
    EXPECT_TRUE(y.is_contiguous());
    expect_close(doubles(y), ref_rope(xd, B, T, H, D, 10000.0, 2, false), 1e-6, 1e-6, "fwd");
    expect_close(doubles(rotary_kernel(x, c, s, true)), ref_rope(xd, B, T, H, D, 10000.0, 2, true),
                 1e-6, 1e-6, "inverse");
    expect_close(doubles(rotary_kernel(y, c, s, true)), xd, 1e-6, 1e-6, "round trip");
  }
}

// bf16 x: rotated in fp32 and rounded once (2^-9 relative; 1e-2 bound plus 1e-2 absolute for
// outputs that cancel to near zero).
TEST(Rotary, BFloat16) {
  const int64_t B = 1, T = 4, H = 2, D = 16;
  auto [c, s] = rope_cache(T, D);
  Tensor x = randn_seeded({B, T, H, D}, 4).to(DType::BFloat16);
  Tensor y = apply_rotary(x, c, s);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  expect_close(doubles(y), ref_rope(doubles(x), B, T, H, D, 10000.0, 0, false), 1e-2, 1e-2);
}

// The gradient (the inverse rotation) agrees with central differences, also for a strided x.
TEST(Rotary, Gradcheck) {
  auto [c, s] = rope_cache(3, 4, 100.0);
  Tensor xa = randn_seeded({2, 3, 2, 4}, 5).set_requires_grad(true);
  Tensor xb = randn_seeded({2, 2, 3, 4}, 6).transpose(1, 2).set_requires_grad(true);
  for (const Tensor& x : {xa, xb}) {
    auto r = autograd::gradcheck([c, s](const TensorList& in) { return apply_rotary(in[0], c, s); },
                                 {x});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// Shape/dtype mistakes are td::Errors: odd head_dim, wrong rank, cos/sin of the wrong shape or
// dtype.
TEST(Rotary, BadInputErrors) {
  auto [c, s] = rope_cache(4, 8);
  EXPECT_THROW(rope_cache(4, 7), Error);
  EXPECT_THROW(apply_rotary(zeros({1, 4, 2, 7}), c, s), Error);
  EXPECT_THROW(apply_rotary(zeros({4, 2, 8}), c, s), Error);
  EXPECT_THROW(apply_rotary(zeros({1, 5, 2, 8}), c, s), Error);  // T mismatch
  EXPECT_THROW(apply_rotary(zeros({1, 4, 2, 8}), c.to(DType::BFloat16), s), Error);
  EXPECT_THROW(apply_rotary(zeros({1, 4, 2, 8}), c, zeros({4, 3})), Error);
  EXPECT_THROW(apply_rotary(zeros({1, 4, 2, 8}, {DType::Int32}), c, s), Error);
}
