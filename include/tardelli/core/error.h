#pragma once
// td::Error and TD_CHECK: the one error type of the library. Every failed check carries the
// condition that failed, where, and a message that names the op, shapes and dtypes involved.
#include <sstream>
#include <stdexcept>
#include <string>

namespace td {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {

inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  append(os, args...);
  return os.str();
}

[[noreturn]] void throw_error(const char* cond, const char* file, int line,
                              const std::string& msg);

}  // namespace detail
}  // namespace td

// TD_CHECK(cond, parts...): throws td::Error whose text is the concatenated parts, followed by
// the failed condition and the source location (for bug reports).
#define TD_CHECK(cond, ...)                                                          \
  do {                                                                               \
    if (!(cond)) [[unlikely]] {                                                      \
      ::td::detail::throw_error(#cond, __FILE__, __LINE__,                           \
                                ::td::detail::str_cat(__VA_ARGS__));                 \
    }                                                                                \
  } while (0)

#define TD_ERROR(...) ::td::detail::throw_error(nullptr, __FILE__, __LINE__, ::td::detail::str_cat(__VA_ARGS__))
