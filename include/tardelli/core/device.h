#pragma once
#include <ostream>
#include <string>

namespace td {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // CUDA ordinal; always 0 for CPU

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::CPU ? 0 : i) {}
  // Parses "cpu", "cuda", "cuda:1".
  static Device parse(const std::string& s);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
inline Device cuda_device(int i = 0) { return Device(DeviceType::CUDA, i); }

std::ostream& operator<<(std::ostream& os, const Device& d);

}  // namespace td
