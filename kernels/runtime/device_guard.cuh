#pragma once
// The current CUDA device of the calling thread, and a guard that sets it for a scope.
namespace td::cuda {

int current_device();
void set_device(int device);

// Sets the current device for its lifetime and restores the previous one afterwards. A
// negative index keeps the current device (so "device = -1 means current" composes).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  int previous() const { return previous_; }

 private:
  int previous_;
  bool changed_ = false;
};

}  // namespace td::cuda
