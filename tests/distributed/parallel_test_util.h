#pragma once
// Shared pieces of the model-parallel suites (tensor, sequence, vocab and context parallel
// layers and GPTs): the same random tensor on every rank, fresh leaves, and the elementwise
// comparison against a one-rank reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tardelli/core/rng.h"
#include "tardelli/core/tensor.h"
#include "tardelli/ops/factory.h"

namespace td::parallel_test {

// The same tensor on every rank: drawn from a generator seeded `seed`.
inline Tensor full_randn(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return randn(shape, {}, &g);
}

// A detached copy that requires grad (a fresh leaf for each side of a comparison).
inline Tensor leaf(const Tensor& t) {
  return t.detach().clone().set_requires_grad(true);
}

inline double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float v : to_vector<float>(t)) m = std::max(m, static_cast<double>(std::fabs(v)));
  return m;
}

// |got - want| <= rel * max|want| elementwise; rel = 0: bitwise equal.
inline void expect_close(const Tensor& got, const Tensor& want, double rel,
                         const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_TRUE(want.defined()) << what << ": reference undefined";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const std::vector<float> g = to_vector<float>(got), w = to_vector<float>(want);
  const double tol = rel * max_abs(want);
  for (size_t i = 0; i < g.size(); ++i) {
    if (rel == 0.0) {
      ASSERT_EQ(g[i], w[i]) << what << " at flat index " << i << " (bitwise)";
    } else {
      ASSERT_NEAR(g[i], w[i], tol) << what << " at flat index " << i;
    }
  }
}

}  // namespace td::parallel_test
