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
  bool released() const { return released_; }

  // Note [Released storage]: ZeRO-2/3 free the bytes of gradient buckets and parameters between
  // uses while the tensors that view them (parameters, .grad views, tensors autograd saved for
  // backward) stay valid handles. release() returns the bytes to the allocator; refill() gives
  // the storage bytes again (same size and device; any values) before the next use. Reading a
  // released tensor is a td::Error (Tensor::data_ptr), never a wild pointer.
  void release();
  void refill(DataPtr data);

 private:
  DataPtr data_;
  size_t nbytes_;
  Device device_;
  bool released_ = false;
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

  // Note [Released storage]. release() is a no-op on a released storage; materialize()
  // allocates fresh (uninitialized) bytes from the device's allocator when released;
  // refill() installs bytes owned elsewhere (e.g. a view into a gathered flat buffer whose
  // deleter keeps that buffer alive). Every tensor sharing this storage sees the change.
  void release() const;
  void materialize() const;
  void refill(DataPtr data) const;
  bool released() const { return impl_ && impl_->released(); }

 private:
  std::shared_ptr<StorageImpl> impl_;
};

}  // namespace td
