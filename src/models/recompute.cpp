#include "tardelli/models/recompute.h"

#include "tardelli/core/error.h"

namespace td::models {

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  TD_CHECK(false, "recompute: unknown mode '", s, "' (choose from none, selective, full)");
  return Recompute::Selective;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

}  // namespace td::models
