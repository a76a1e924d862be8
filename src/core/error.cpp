#include "tardelli/core/error.h"

namespace td::detail {

void throw_error(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << msg;
  if (cond) os << " [check failed: " << cond << " at " << file << ":" << line << "]";
  throw Error(os.str());
}

}  // namespace td::detail
