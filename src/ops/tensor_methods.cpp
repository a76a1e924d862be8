// Note [Tensor methods]: core/tensor.h declares the convenience methods users expect
// (t.view(...), t.to(...)); they are defined here, in the ops layer, as calls to the free
// functions, so the core stays free of op code while C++ reads like torch.
#include "tardelli/ops/copy.h"
#include "tardelli/ops/view.h"

namespace td {

Tensor Tensor::view(const Shape& s) const { return td::view(*this, s); }
Tensor Tensor::reshape(const Shape& s) const { return td::reshape(*this, s); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return td::transpose(*this, a, b); }
Tensor Tensor::t() const {
  TD_CHECK(dim() <= 2, "t(): expects a tensor with <= 2 dims, got ", describe(*this));
  return dim() < 2 ? *this : td::transpose(*this, 0, 1);
}
Tensor Tensor::permute(const Shape& d) const { return td::permute(*this, d); }
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return td::narrow(*this, d, s, l); }
Tensor Tensor::slice(int64_t d, int64_t s, int64_t e, int64_t st) const {
  return td::slice(*this, d, s, e, st);
}
Tensor Tensor::select(int64_t d, int64_t i) const { return td::select(*this, d, i); }
Tensor Tensor::expand(const Shape& s) const { return td::expand(*this, s); }
Tensor Tensor::squeeze(std::optional<int64_t> d) const { return td::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return td::unsqueeze(*this, d); }
Tensor Tensor::flatten(int64_t s, int64_t e) const { return td::flatten(*this, s, e); }
Tensor Tensor::contiguous() const { return td::contiguous(*this); }

Tensor Tensor::to(DType dt) const { return to_dtype(*this, dt); }
Tensor Tensor::to(Device d) const { return to_device(*this, d); }
Tensor Tensor::clone() const { return td::clone(*this); }
Tensor& Tensor::copy_(const Tensor& src) {
  copy_into(*this, src);
  return *this;
}

}  // namespace td
