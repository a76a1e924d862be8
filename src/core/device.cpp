#include "tardelli/core/device.h"

#include "tardelli/core/error.h"

namespace td {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return kCPU;
  if (s == "cuda") return Device(DeviceType::CUDA, 0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      int idx = std::stoi(s.substr(5), &used);
      if (used == s.size() - 5 && idx >= 0) return Device(DeviceType::CUDA, idx);
    } catch (const std::exception&) {
    }
  }
  TD_ERROR("invalid device string '", s, "' (expected 'cpu', 'cuda' or 'cuda:N')");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace td
