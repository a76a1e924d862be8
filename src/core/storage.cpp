#include "tardelli/core/storage.h"

#include "tardelli/core/error.h"

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

void StorageImpl::release() {
  // Not data_.reset(): that frees the bytes but keeps the deleter, and a refill()'s deleter may
  // own the buffer it points into (Note [FSDP parameter storage]); assigning a fresh DataPtr
  // runs the deleter and then destroys it.
  data_ = DataPtr();
  released_ = true;
}

void StorageImpl::refill(DataPtr data) {
  TD_CHECK(data != nullptr || nbytes_ == 0, "Storage.refill: null bytes for a storage of ",
           nbytes_, " bytes");
  data_ = std::move(data);
  released_ = false;
}

void Storage::release() const {
  if (impl_) impl_->release();
}

void Storage::materialize() const {
  TD_CHECK(impl_ != nullptr, "Storage.materialize: undefined storage");
  if (!impl_->released()) return;
  impl_->refill(get_allocator(impl_->device()).allocate_on(impl_->device().index, impl_->nbytes()));
}

void Storage::refill(DataPtr data) const {
  TD_CHECK(impl_ != nullptr, "Storage.refill: undefined storage");
  impl_->refill(std::move(data));
}

}  // namespace td
