#pragma once
// Python's spelling of values in the configuration's messages and Python's reading of numbers
// in its flags (Note [Configuration errors] in train/train_config.h): the C++ CLI's texts must be
// the Python CLI's, and a flag that Python accepts must be accepted here.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tardelli/core/json.h"

namespace td::train::py {

// str(x) / repr(x) of a Python float: the shortest text that reads back to x, in fixed notation
// for 1e-4 <= |x| < 1e16 (always with a fraction: "1.0"), else "1e-05" / "1.5e+16"; "inf",
// "-inf", "nan".
std::string str(double x);
// repr(s) of a Python str: single quotes unless s holds ' and no ", backslash escapes.
std::string repr(std::string_view s);
inline std::string repr(const std::string& s) {
  return repr(std::string_view(s));
}
inline std::string repr(const char* s) {
  return repr(std::string_view(s));
}
// repr of a value: 'text', 3, 1.5, True / False, None, [a, b], {'k': v}.
std::string repr(const json::Value& v);
const char* str(bool b);  // "True" / "False"

// int(s) / float(s): surrounding whitespace, a sign, '_' between digits; float also takes
// inf, infinity and nan in any case. nullopt where Python raises ValueError, and for an int
// outside int64 (which Python would accept).
std::optional<int64_t> parse_int(std::string_view s);
std::optional<double> parse_float(std::string_view s);

// sep.join(parts), with each part passed through f (default: as is).
template <typename Range, typename F>
std::string join(std::string_view sep, const Range& parts, F&& f) {
  std::string out;
  bool first = true;
  for (const auto& p : parts) {
    if (!first) out += sep;
    out += f(p);
    first = false;
  }
  return out;
}
template <typename Range>
std::string join(std::string_view sep, const Range& parts) {
  return join(sep, parts, [](const auto& p) -> std::string_view { return p; });
}

// s.split(sep) (an empty s gives one empty piece) and s.strip() (ASCII whitespace).
std::vector<std::string_view> split(std::string_view s, char sep);
std::string_view strip(std::string_view s);

}  // namespace td::train::py
