#pragma once
// Storage owns the bytes behind one or more tensors (views share a Storage).
#include <memory>

#include "tardelli/core/allocator.h"

namespace td {

class StorageImpl {
 public:
  StorageImpl(DataPtr data, size_t nbytes, Device device)
      : data_(std::move(data)), nbytes_(nbytes), device_(device) {}
  void* data() const { return data_.get(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  DataPtr data_;
  size_t nbytes_;
  Device device_;
};

class Storage {
 public:
  Storage() = default;
  // Allocates nbytes on `device` from its registered allocator.
  static Storage allocate(size_t nbytes, Device device);
  // Wraps memory owned elsewhere (numpy arrays, user buffers); `deleter` runs when the last
  // tensor using it goes away.
  static Storage wrap(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);

  void* data() const { return impl_ ? impl_->data() : nullptr; }
  size_t nbytes() const { return impl_ ? impl_->nbytes() : 0; }
  Device device() const { return impl_ ? impl_->device() : kCPU; }
  bool defined() const { return impl_ != nullptr; }
  bool is_same(const Storage& o) const { return impl_ == o.impl_; }
  long use_count() const { return impl_.use_count(); }

 private:
  std::shared_ptr<StorageImpl> impl_;
};

}  // namespace td
