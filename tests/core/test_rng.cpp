#include <gtest/gtest.h>

#include <cmath>
#include <omp.h>

#include "tardelli/tardelli.h"

using namespace td;

// Philox4x32-10 matches Random123's published known-answer vectors (tests/kat_vectors).
TEST(Philox, KnownAnswerVectors) {
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Same seed, same numbers; the stream advances; a draw equals the concatenation of smaller
// draws only at block boundaries (offset counts blocks of 4).
TEST(Generator, ReproducibleAndAdvancing) {
  Generator a(42), b(42);
  Tensor x = randn({1000}, {}, &a), y = randn({1000}, {}, &b);
  EXPECT_EQ(to_vector<float>(x), to_vector<float>(y));
  Tensor z = randn({1000}, {}, &a);
  EXPECT_NE(to_vector<float>(x), to_vector<float>(z));
  EXPECT_EQ(a.offset(), 500u);

  Generator c(42);
  Tensor p1 = rand({8}, {}, &c), p2 = rand({8}, {}, &c);
  Generator d(42);
  std::vector<float> whole = to_vector<float>(rand({16}, {}, &d));
  std::vector<float> parts = to_vector<float>(p1);
  for (float v : to_vector<float>(p2)) parts.push_back(v);
  EXPECT_EQ(parts, whole);
}

// Split streams are distinct from the parent and from each other, and deterministic.
TEST(Generator, SplitStreamsIndependent) {
  Generator g(7);
  Generator s0 = g.split(0), s1 = g.split(1), s0b = g.split(0);
  auto v0 = to_vector<float>(rand({64}, {}, &s0));
  auto v1 = to_vector<float>(rand({64}, {}, &s1));
  auto v0b = to_vector<float>(rand({64}, {}, &s0b));
  auto vp = to_vector<float>(rand({64}, {}, &g));
  EXPECT_EQ(v0, v0b);
  EXPECT_NE(v0, v1);
  EXPECT_NE(v0, vp);
}

// The numbers do not depend on the thread count (element i is a function of (seed, offset, i)).
TEST(Generator, IndependentOfThreads) {
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  Generator a(3);
  auto one = to_vector<float>(randn({100000}, {}, &a));
  omp_set_num_threads(2);
  Generator b(3);
  auto two = to_vector<float>(randn({100000}, {}, &b));
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

// randn moments: mean 0 and variance 1 within 6 standard errors for n = 200k draws.
TEST(Generator, NormalMoments) {
  Generator g(11);
  const int n = 200000;
  auto v = to_vector<float>(randn({n}, {}, &g));
  double m = 0, s2 = 0;
  for (float x : v) m += x;
  m /= n;
  for (float x : v) s2 += (x - m) * (x - m);
  s2 /= n - 1;
  EXPECT_NEAR(m, 0.0, 6.0 / std::sqrt(n));
  EXPECT_NEAR(s2, 1.0, 6.0 * std::sqrt(2.0 / n));
  auto u = to_vector<float>(rand({n}, {}, &g));
  for (float x : u) ASSERT_TRUE(x >= 0.0f && x < 1.0f);
}
