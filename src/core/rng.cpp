#include "tardelli/core/rng.h"

#include <cmath>

#include "tardelli/core/error.h"

namespace td {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

namespace {

inline std::array<uint32_t, 4> block(const PhiloxState& st, uint64_t b) {
  uint64_t ctr = st.offset + b;
  return philox4x32({static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32),
                     static_cast<uint32_t>(st.subsequence),
                     static_cast<uint32_t>(st.subsequence >> 32)},
                    {static_cast<uint32_t>(st.seed), static_cast<uint32_t>(st.seed >> 32)});
}

}  // namespace

void philox_uniform(const PhiloxState& st, float* out, int64_t n) {
  int64_t nblocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (nblocks > 4096)
  for (int64_t b = 0; b < nblocks; ++b) {
    auto r = block(st, static_cast<uint64_t>(b));
    for (int l = 0; l < 4; ++l) {
      int64_t i = b * 4 + l;
      if (i < n) out[i] = uint_to_uniform(r[l]);
    }
  }
}

void philox_normal(const PhiloxState& st, float* out, int64_t n) {
  int64_t nblocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (nblocks > 4096)
  for (int64_t b = 0; b < nblocks; ++b) {
    auto r = block(st, static_cast<uint64_t>(b));
    float z[4];
    for (int p = 0; p < 2; ++p) {
      // u1 in (0, 1] so log never sees 0.
      float u1 = 1.0f - uint_to_uniform(r[2 * p]);
      float u2 = uint_to_uniform(r[2 * p + 1]);
      float rad = std::sqrt(-2.0f * std::log(u1));
      float th = 6.2831853071795864f * u2;
      z[2 * p] = rad * std::cos(th);
      z[2 * p + 1] = rad * std::sin(th);
    }
    for (int l = 0; l < 4; ++l) {
      int64_t i = b * 4 + l;
      if (i < n) out[i] = z[l];
    }
  }
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = seed;
  offset_ = 0;
}

void Generator::set_state(uint64_t seed, uint64_t offset, uint64_t subsequence) {
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = seed;
  offset_ = offset;
  subsequence_ = subsequence;
}

PhiloxState Generator::reserve(int64_t n) {
  TD_CHECK(n >= 0, "Generator::reserve: negative count ", n);
  std::lock_guard<std::mutex> lock(mu_);
  PhiloxState st{seed_, offset_, subsequence_};
  offset_ += static_cast<uint64_t>((n + 3) / 4);
  return st;
}

Generator Generator::split(uint64_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Subsequences are 64-bit: mix the parent's subsequence with the index so nested splits
  // do not collide with siblings.
  uint64_t sub = (subsequence_ + 1) * 0x9E3779B97F4A7C15ULL ^ (index + 1);
  return Generator(seed_, sub);
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace td
