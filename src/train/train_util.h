#pragma once
// Small helpers the training loop's source files share (src/train/trainer*.cpp and
// train_metrics.cpp); not part of the public API.
#include <string>

namespace td::train::detail {

// Wall clock (seconds since the epoch) and a monotonic clock (seconds).
double now_s();
double perf_s();

// printf-style formatting of one number as Python's format() spells it: "nan", "inf" and
// "-inf" for the non-finite values (C's printf may write "-nan").
std::string fmt(const char* f, double v);

// Python's f"{v:,.0f}": rounded, with thousands separators.
std::string with_commas(double v);

}  // namespace td::train::detail
