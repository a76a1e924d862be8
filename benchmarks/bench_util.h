#pragma once
// Timing helpers shared by the benchmark binaries in this folder.
#include <algorithm>
#include <chrono>
#include <vector>

namespace td::bench {

// Seconds on the steady clock.
inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The upper median of `t` (non-empty).
inline double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace td::bench
