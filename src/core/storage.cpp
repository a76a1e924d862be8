#include "tardelli/core/storage.h"

namespace td {

Storage Storage::allocate(size_t nbytes, Device device) {
  Storage s;
  s.impl_ = std::make_shared<StorageImpl>(get_allocator(device).allocate_on(device.index, nbytes), nbytes, device);
  return s;
}

Storage Storage::wrap(void* data, size_t nbytes, Device device,
                      std::function<void(void*)> deleter) {
  Storage s;
  s.impl_ = std::make_shared<StorageImpl>(DataPtr(data, std::move(deleter)), nbytes, device);
  return s;
}

}  // namespace td
