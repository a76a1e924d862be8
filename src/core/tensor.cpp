#include "tardelli/core/tensor.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "tardelli/autograd/node.h"

namespace td {

Tensor Tensor::empty(const Shape& sizes, DType dtype, Device device) {
  for (int64_t s : sizes) {
    TD_CHECK(s >= 0, "empty: negative dimension in shape ", shape_str(sizes));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(numel_of(sizes) * itemsize(dtype), device);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::make(Storage storage, Shape sizes, Shape strides, int64_t offset, DType dtype) {
  TD_CHECK(sizes.size() == strides.size(), "Tensor::make: sizes ", shape_str(sizes),
           " and strides ", shape_str(strides), " differ in length");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const { return impl_->sizes[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  // As in torch, a tensor without elements is contiguous whatever its strides
  // (contiguous_strides gives a size-0 dim the stride of a size-1 one).
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->sizes[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->sizes[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  TD_CHECK(defined(), "data_ptr() called on an undefined tensor");
  TD_CHECK(!impl_->storage.released(), "data_ptr(): the storage of ", describe(*this),
           " is released (a ZeRO-2/3 gradient bucket or sharded parameter between uses: "
           "Note [Released storage])");
  return static_cast<char*>(impl_->storage.data()) + impl_->offset * element_size();
}

double Tensor::item_double() const {
  TD_CHECK(defined(), "item(): undefined tensor");
  TD_CHECK(numel() == 1, "item(): only one-element tensors can be converted to a scalar, got ",
           describe(*this));
  Tensor c = is_cpu() ? *this : to(kCPU);
  return TD_DISPATCH_ALL_AND_FLOAT8(c.dtype(), "item", [&]<typename T>() -> double {
    return static_cast<double>(static_cast<acc_t<T>>(*static_cast<const T*>(c.data_ptr())));
  });
}

template <typename T>
T Tensor::item() const {
  return static_cast<T>(item_double());
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template int32_t Tensor::item<int32_t>() const;
template bool Tensor::item<bool>() const;

namespace {

void print_rec(std::ostream& os, const Tensor& t, int64_t d, int64_t offset, bool summarize,
               int indent) {
  auto value_at = [&](int64_t off) -> std::string {
    return TD_DISPATCH_ALL_AND_FLOAT8(t.dtype(), "print", [&]<typename T>() -> std::string {
      const T* base = static_cast<const T*>(t.storage().data());
      std::ostringstream s;
      if constexpr (std::is_same_v<T, bool>) {
        s << (base[off] ? "True" : "False");
      } else if constexpr (std::is_integral_v<T>) {
        s << base[off];
      } else {
        float v = static_cast<float>(base[off]);
        if (std::isfinite(v) && std::fabs(v) < 1e5 && (v == 0 || std::fabs(v) >= 1e-4)) {
          s << std::fixed << std::setprecision(4) << v;
        } else {
          s << std::scientific << std::setprecision(4) << v;
        }
      }
      return s.str();
    });
  };
  if (t.dim() == 0) {
    os << value_at(offset);
    return;
  }
  int64_t n = t.size(d);
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 6 && i == 3) {
      os << "...";
      i = n - 4;
      os << (d + 1 == t.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
      continue;
    }
    int64_t off = offset + i * t.stride(d);
    if (d + 1 == t.dim()) {
      os << value_at(off);
    } else {
      print_rec(os, t, d + 1, off, summarize, indent + 1);
    }
    if (i + 1 < n) os << (d + 1 == t.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  Tensor c = is_cpu() ? *this : to(kCPU);
  print_rec(os, c, 0, c.storage_offset(), numel() > 1000, 7);
  if (dtype() != DType::Float32 && dtype() != DType::Int64) os << ", dtype=" << dtype_name(dtype());
  if (!is_cpu()) os << ", device='" << device().str() << "'";
  if (auto fn = grad_fn()) {
    os << ", grad_fn=<" << fn->name() << ">";
  } else if (requires_grad()) {
    os << ", requires_grad=True";
  }
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = std::string(dtype_name(t.dtype())) + shape_str(t.sizes());
  if (!t.is_cpu()) s += " (" + t.device().str() + ")";
  return s;
}

}  // namespace td
