#pragma once
// Small helpers the training loop's source files share (src/train/trainer*.cpp and
// train_metrics.cpp); not part of the public API.
#include <string>

namespace td::models {
class GPT;
}

namespace td::train::detail {

// Wall clock (seconds since the epoch) and a monotonic clock (seconds).
double now_s();
double perf_s();

// printf-style formatting of one number as Python's format() spells it: "nan", "inf" and
// "-inf" for the non-finite values (C's printf may write "-nan").
std::string fmt(const char* f, double v);

// Python's f"{v:,.0f}": rounded, with thousands separators.
std::string with_commas(double v);

// Whether parameter `name` of `m` counts in the global gradient norm on this rank: split over tp
// (every tp rank holds a part), or replicated and this is tp rank 0; a pipeline stage's copy of
// the tied embedding never (model_parallel._counts).
bool counts_in_norm(const models::GPT& m, const std::string& name, bool tp);

}  // namespace td::train::detail
