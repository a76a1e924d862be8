#include "tardelli/ops/view.h"

#include <numeric>

#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

Tensor alias(const Tensor& t, Shape sizes, Shape strides, int64_t offset) {
  return Tensor::make(t.storage(), std::move(sizes), std::move(strides), offset, t.dtype());
}

// Strides for viewing (sizes, strides) as `shape` without a copy, if possible (torch's
// computeStride): dims are grouped into chunks that are contiguous in memory.
std::optional<Shape> view_strides(const Shape& old_sizes, const Shape& old_strides,
                                  const Shape& shape) {
  Shape out(shape.size());
  if (numel_of(old_sizes) == 0 || old_sizes.empty()) return contiguous_strides(shape);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_sizes[d];
    if (d == 0 || (old_sizes[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

Tensor scatter_into_zeros(const Tensor& g, const Shape& sizes,
                          const std::function<Tensor(const Tensor&)>& make_view) {
  Tensor z = zeros(sizes, {g.dtype(), g.device()});
  copy_into(make_view(z), g);
  return z;
}

}  // namespace

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TD_CHECK(infer < 0, op, ": only one dimension can be -1 in shape ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      TD_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in shape ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    TD_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape),
             " is invalid for input of size ", numel);
    out[infer] = numel / known;
  } else {
    TD_CHECK(known == numel, op, ": shape ", shape_str(shape), " is invalid for input of size ",
             numel);
  }
  return out;
}

Tensor view(const Tensor& t, const Shape& shape) {
  TD_CHECK(t.defined(), "view: undefined tensor");
  Shape sizes = infer_shape(shape, t.numel(), "view");
  auto st = view_strides(t.sizes(), t.strides(), sizes);
  TD_CHECK(st.has_value(), "view: size ", shape_str(shape), " is not compatible with input of ",
           "shape ", shape_str(t.sizes()), " and strides ", shape_str(t.strides()),
           " (at least one dim spans two non-contiguous subspaces); use reshape instead");
  Tensor out = alias(t, sizes, *st, t.storage_offset());
  if (needs_grad({t})) {
    record("ViewBackward", {t}, {&out}, [in = t.sizes()](const TensorList& g, const auto&) {
      return TensorList{reshape(g[0], in)};
    });
  }
  return out;
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  TD_CHECK(t.defined(), "reshape: undefined tensor");
  Shape sizes = infer_shape(shape, t.numel(), "reshape");
  if (view_strides(t.sizes(), t.strides(), sizes)) return view(t, sizes);
  return view(contiguous(t), sizes);
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  TD_CHECK(t.defined(), "transpose: undefined tensor");
  d0 = wrap_dim(d0, t.dim(), "transpose");
  d1 = wrap_dim(d1, t.dim(), "transpose");
  if (t.dim() == 0) return t;
  Shape sz = t.sizes(), st = t.strides();
  std::swap(sz[d0], sz[d1]);
  std::swap(st[d0], st[d1]);
  Tensor out = alias(t, sz, st, t.storage_offset());
  if (needs_grad({t})) {
    record("TransposeBackward", {t}, {&out}, [d0, d1](const TensorList& g, const auto&) {
      return TensorList{transpose(g[0], d0, d1)};
    });
  }
  return out;
}

Tensor permute(const Tensor& t, const Shape& dims) {
  TD_CHECK(t.defined(), "permute: undefined tensor");
  TD_CHECK(static_cast<int64_t>(dims.size()) == t.dim(), "permute: got ", dims.size(),
           " dims for a tensor with ", t.dim(), " dims");
  Shape sz(dims.size()), st(dims.size()), inv(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], t.dim(), "permute");
    TD_CHECK(!seen[d], "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    sz[i] = t.size(d);
    st[i] = t.stride(d);
    inv[d] = static_cast<int64_t>(i);
  }
  Tensor out = alias(t, sz, st, t.storage_offset());
  if (needs_grad({t})) {
    record("PermuteBackward", {t}, {&out}, [inv](const TensorList& g, const auto&) {
      return TensorList{permute(g[0], inv)};
    });
  }
  return out;
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  TD_CHECK(t.defined(), "slice: undefined tensor");
  TD_CHECK(t.dim() > 0, "slice: cannot slice a 0-dim tensor");
  dim = wrap_dim(dim, t.dim(), "slice");
  TD_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = t.size(dim);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  int64_t len = (end - start + step - 1) / step;
  Shape sz = t.sizes(), st = t.strides();
  sz[dim] = len;
  st[dim] = t.stride(dim) * step;
  Tensor out = alias(t, sz, st, t.storage_offset() + start * t.stride(dim));
  if (needs_grad({t})) {
    record("SliceBackward", {t}, {&out},
           [in = t.sizes(), dim, start, end, step](const TensorList& g, const auto&) {
             return TensorList{scatter_into_zeros(g[0], in, [&](const Tensor& z) {
               return slice(z, dim, start, end, step);
             })};
           });
  }
  return out;
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  TD_CHECK(t.defined(), "narrow: undefined tensor");
  dim = wrap_dim(dim, t.dim(), "narrow");
  int64_t n = t.size(dim);
  if (start < 0) start += n;
  TD_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: start ", start,
           " and length ", length, " out of range for dim ", dim, " of size ", n);
  return slice(t, dim, start, start + length, 1);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  TD_CHECK(t.defined(), "select: undefined tensor");
  TD_CHECK(t.dim() > 0, "select: cannot index a 0-dim tensor");
  dim = wrap_dim(dim, t.dim(), "select");
  int64_t n = t.size(dim);
  TD_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dim ", dim,
           " of size ", n);
  if (index < 0) index += n;
  Shape sz = t.sizes(), st = t.strides();
  sz.erase(sz.begin() + dim);
  st.erase(st.begin() + dim);
  Tensor out = alias(t, sz, st, t.storage_offset() + index * t.stride(dim));
  if (needs_grad({t})) {
    record("SelectBackward", {t}, {&out}, [in = t.sizes(), dim, index](const TensorList& g,
                                                                      const auto&) {
      return TensorList{scatter_into_zeros(g[0], in, [&](const Tensor& z) {
        return select(z, dim, index);
      })};
    });
  }
  return out;
}

Tensor expand(const Tensor& t, const Shape& shape) {
  TD_CHECK(t.defined(), "expand: undefined tensor");
  TD_CHECK(static_cast<int64_t>(shape.size()) >= t.dim(), "expand: the number of sizes (",
           shape.size(), ") must be at least the tensor's dims (", t.dim(), ")");
  Shape target = shape;
  size_t lead = shape.size() - t.sizes().size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TD_CHECK(i >= lead, "expand: -1 not allowed for a new leading dim in ", shape_str(shape));
      target[i] = t.sizes()[i - lead];
    }
  }
  Shape st = broadcast_strides(t.sizes(), t.strides(), target);
  Tensor out = alias(t, target, st, t.storage_offset());
  if (needs_grad({t})) {
    record("ExpandBackward", {t}, {&out}, [in = t.sizes()](const TensorList& g, const auto&) {
      return TensorList{sum_to(g[0], in)};
    });
  }
  return out;
}

Tensor squeeze(const Tensor& t, std::optional<int64_t> dim) {
  TD_CHECK(t.defined(), "squeeze: undefined tensor");
  Shape sz, st;
  std::optional<int64_t> d;
  if (dim) d = wrap_dim(*dim, t.dim(), "squeeze");
  for (int64_t i = 0; i < t.dim(); ++i) {
    bool drop = t.size(i) == 1 && (!d || *d == i);
    if (!drop) {
      sz.push_back(t.size(i));
      st.push_back(t.stride(i));
    }
  }
  Tensor out = alias(t, sz, st, t.storage_offset());
  if (needs_grad({t})) {
    record("SqueezeBackward", {t}, {&out}, [in = t.sizes()](const TensorList& g, const auto&) {
      return TensorList{reshape(g[0], in)};
    });
  }
  return out;
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  TD_CHECK(t.defined(), "unsqueeze: undefined tensor");
  dim = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape sz = t.sizes(), st = t.strides();
  int64_t s = dim < t.dim() ? t.stride(dim) * t.size(dim) : 1;
  sz.insert(sz.begin() + dim, 1);
  st.insert(st.begin() + dim, s);
  Tensor out = alias(t, sz, st, t.storage_offset());
  if (needs_grad({t})) {
    record("UnsqueezeBackward", {t}, {&out}, [dim](const TensorList& g, const auto&) {
      return TensorList{squeeze(g[0], dim)};
    });
  }
  return out;
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  TD_CHECK(t.defined(), "flatten: undefined tensor");
  if (t.dim() == 0) return reshape(t, {1});
  start_dim = wrap_dim(start_dim, t.dim(), "flatten");
  end_dim = wrap_dim(end_dim, t.dim(), "flatten");
  TD_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " > end_dim ", end_dim);
  Shape sz;
  for (int64_t i = 0; i < start_dim; ++i) sz.push_back(t.size(i));
  int64_t m = 1;
  for (int64_t i = start_dim; i <= end_dim; ++i) m *= t.size(i);
  sz.push_back(m);
  for (int64_t i = end_dim + 1; i < t.dim(); ++i) sz.push_back(t.size(i));
  return reshape(t, sz);
}

Tensor contiguous(const Tensor& t) {
  TD_CHECK(t.defined(), "contiguous: undefined tensor");
  if (t.is_contiguous()) return t;
  return clone(t);
}

Tensor as_strided(const Tensor& t, const Shape& sizes, const Shape& strides, int64_t offset) {
  TD_CHECK(sizes.size() == strides.size(), "as_strided: sizes ", shape_str(sizes),
           " and strides ", shape_str(strides), " differ in length");
  int64_t max_off = offset;
  for (size_t i = 0; i < sizes.size(); ++i) {
    TD_CHECK(sizes[i] >= 0 && strides[i] >= 0, "as_strided: negative size or stride");
    if (sizes[i] > 0) max_off += (sizes[i] - 1) * strides[i];
  }
  TD_CHECK(numel_of(sizes) == 0 ||
               (offset >= 0 && static_cast<size_t>(max_off + 1) * t.element_size() <=
                                   t.storage().nbytes()),
           "as_strided: view of sizes ", shape_str(sizes), " strides ", shape_str(strides),
           " offset ", offset, " exceeds the storage of ", t.storage().nbytes(), " bytes");
  return alias(t, sizes, strides, offset);
}

}  // namespace td
