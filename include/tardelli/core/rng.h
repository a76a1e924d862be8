#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A stream is (seed, offset):
// element i of a draw of N values uses counter block (offset + i/4, subsequence) and lane i%4,
// and the draw advances offset by ceil(N/4). Any backend that follows this rule (the CUDA
// kernels do) produces the same numbers, and results do not depend on thread count.
#include <array>
#include <cstdint>
#include <mutex>

namespace td {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// The state a kernel needs to reproduce one draw.
struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;       // in blocks of 4 values
  uint64_t subsequence = 0;  // distinguishes streams split from one generator
};

// Uniform float in [0, 1) from 32 random bits (24-bit mantissa, never returns 1).
inline float uint_to_uniform(uint32_t x) { return static_cast<float>(x >> 8) * 0x1.0p-24f; }

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ULL, uint64_t subsequence = 0)
      : seed_(seed), subsequence_(subsequence) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  uint64_t subsequence() const { return subsequence_; }
  void set_state(uint64_t seed, uint64_t offset, uint64_t subsequence = 0);

  // Reserves a draw of n values and returns the state that reproduces it.
  PhiloxState reserve(int64_t n);
  // An independent stream: same seed, another subsequence; does not advance this one.
  Generator split(uint64_t index) const;

 private:
  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  uint64_t subsequence_;
};

// The process-wide default generator (td.manual_seed sets it).
Generator& default_generator();
void manual_seed(uint64_t seed);

// Fills out[0..n) from the stream `st` (the rule above).
void philox_uniform(const PhiloxState& st, float* out, int64_t n);
// Standard normals by Box-Muller: lanes (0,1) and (2,3) of each block give two normals each.
void philox_normal(const PhiloxState& st, float* out, int64_t n);

}  // namespace td
