#pragma once
// td::Tensor: a handle to sizes, strides, an offset and a dtype over a shared Storage. Copying a
// Tensor copies the handle (like torch.Tensor in Python); views share storage without copying.
// Autograd metadata is attached through a pointer, not baked into the core (see autograd/).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tardelli/core/device.h"
#include "tardelli/core/dtype.h"
#include "tardelli/core/shape.h"
#include "tardelli/core/storage.h"

namespace td {

namespace autograd {
struct AutogradMeta;
class Node;
}  // namespace autograd

class Tensor;
using TensorList = std::vector<Tensor>;

struct TensorImpl {
  Storage storage;
  Shape sizes;
  Shape strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;
  std::shared_ptr<autograd::AutogradMeta> autograd_meta;  // null: no autograd state
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Allocates an uninitialized contiguous tensor.
  static Tensor empty(const Shape& sizes, DType dtype = DType::Float32, Device device = kCPU);
  // A tensor over an existing storage (no copy).
  static Tensor make(Storage storage, Shape sizes, Shape strides, int64_t offset, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const { return impl_->sizes; }
  const Shape& shape() const { return impl_->sizes; }
  const Shape& strides() const { return impl_->strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl_->sizes.size()); }
  int64_t numel() const { return numel_of(impl_->sizes); }
  int64_t storage_offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage.device(); }
  size_t element_size() const { return itemsize(impl_->dtype); }
  size_t nbytes() const { return numel() * element_size(); }
  bool is_contiguous() const;
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_floating_point() const { return is_floating(dtype()); }
  const Storage& storage() const { return impl_->storage; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const { return impl_->storage.is_same(o.impl_->storage); }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // Pointer to the first element. The typed version checks the dtype.
  void* data_ptr() const;
  template <typename T>
  T* data_ptr() const {
    TD_CHECK(dtype_of<T>::value == dtype(), "data_ptr<", dtype_name(dtype_of<T>::value),
             ">() called on a tensor of dtype ", dtype_name(dtype()));
    return static_cast<T*>(data_ptr());
  }
  // The value of a one-element tensor, converted to T.
  template <typename T>
  T item() const;
  double item_double() const;

  std::string str() const;  // torch-like repr: values (abridged), shape, dtype, grad_fn

  // ---- views (defined in ops/view.cpp; differentiable) ----
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;
  Tensor permute(const Shape& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze(std::optional<int64_t> dim = std::nullopt) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;

  // ---- conversions and copies (ops/copy.cpp) ----
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor clone() const;
  Tensor& copy_(const Tensor& src);  // broadcasting, dtype-converting copy into this
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  // ---- autograd (autograd/tensor_autograd.cpp) ----
  bool requires_grad() const;
  Tensor& set_requires_grad(bool r);
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  std::shared_ptr<autograd::Node> grad_fn() const;
  bool is_leaf() const;
  uint32_t output_nr() const;
  // Computes gradients of this tensor w.r.t. graph leaves; `gradient` defaults to ones for a
  // one-element tensor.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false,
                bool create_graph = false) const;
  Tensor detach() const;  // shares storage, no autograd history
  // A hook sees the gradient w.r.t. this tensor and may return a replacement (or nullopt).
  using Hook = std::function<std::optional<Tensor>(const Tensor&)>;
  void register_hook(Hook hook) const;
  // Runs after a leaf's .grad has been accumulated (data-parallel bucketing uses this).
  void register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;
  void retain_grad() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Short description for error messages: "float32[2, 3] (cpu)".
std::string describe(const Tensor& t);

}  // namespace td
