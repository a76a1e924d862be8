#include "tardelli/ops/join.h"

#include <algorithm>

#include "ops/common.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/view.h"

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

// Note [Legacy empty cat inputs]: like torch, a 1-D tensor of size 0 may be concatenated with
// tensors of any rank; it is skipped (its gradient is an empty tensor of its own shape).
bool is_skipped(const Tensor& t, int64_t ref_dim) {
  return t.dim() == 1 && t.numel() == 0 && ref_dim != 1;
}

}  // namespace

Tensor cat(const TensorList& tensors, int64_t dim) {
  const char* op = "cat";
  TD_CHECK(!tensors.empty(), op, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TD_CHECK(tensors[i].defined(), op, ": tensor ", i, " is undefined");
  }
  // The reference tensor: the first that is not a legacy empty 1-D tensor.
  size_t ref = 0;
  while (ref + 1 < tensors.size() && tensors[ref].dim() == 1 && tensors[ref].numel() == 0) ++ref;
  const Tensor& r = tensors[ref];
  TD_CHECK(r.dim() > 0, op, ": zero-dimensional tensor (", describe(r), ") cannot be concatenated");
  dim = wrap_dim(dim, r.dim(), op);
  // Any device: the pieces are written with copy_into, which every backend implements.
  Shape out_shape = r.sizes();
  out_shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    TD_CHECK(t.dtype() == r.dtype(), op, ": expected all tensors to have the same dtype, got ",
             describe(r), " (tensor ", ref, ") and ", describe(t), " (tensor ", i, ")");
    TD_CHECK(t.device() == r.device(), op, ": expected all tensors on the same device, got ",
             describe(r), " (tensor ", ref, ") and ", describe(t), " (tensor ", i, ")");
    if (is_skipped(t, r.dim())) continue;
    TD_CHECK(t.dim() == r.dim(), op, ": tensors must have the same number of dims, got ",
             describe(r), " (tensor ", ref, ") and ", describe(t), " (tensor ", i, ")");
    for (int64_t d = 0; d < r.dim(); ++d) {
      TD_CHECK(d == dim || t.size(d) == r.size(d), op, ": sizes of tensors must match except in ",
               "dim ", dim, "; tensor ", i, " has shape ", shape_str(t.sizes()), " but tensor ",
               ref, " has shape ", shape_str(r.sizes()), " (mismatch in dim ", d, ")");
    }
    out_shape[dim] += t.size(dim);
  }
  Tensor out = Tensor::empty(out_shape, r.dtype(), r.device());
  std::vector<int64_t> starts(tensors.size(), 0);
  int64_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    starts[i] = off;
    if (is_skipped(t, r.dim())) continue;
    int64_t len = t.size(dim);
    if (len > 0 && out.numel() > 0) copy_into(narrow(out, dim, off, len), t.detach());
    off += len;
  }
  if (needs_grad(tensors)) {
    std::vector<Shape> shapes;
    for (const auto& t : tensors) shapes.push_back(t.sizes());
    record("CatBackward", tensors, {&out},
           [dim, starts, shapes, rd = r.dim()](const TensorList& g, const auto& need) {
             TensorList gs(shapes.size());
             for (size_t i = 0; i < shapes.size(); ++i) {
               if (!need[i]) continue;
               bool skipped = shapes[i].size() == 1 && shapes[i][0] == 0 && rd != 1;
               gs[i] = skipped ? zeros(shapes[i], {g[0].dtype(), g[0].device()})
                               : narrow(g[0], dim, starts[i], shapes[i][dim]);
             }
             return gs;
           });
  }
  return out;
}

Tensor stack(const TensorList& tensors, int64_t dim) {
  TD_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TD_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    TD_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack: expects each tensor to be equal ",
             "size, but got ", shape_str(tensors[0].sizes()), " at entry 0 and ",
             shape_str(tensors[i].sizes()), " at entry ", i);
  }
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  TensorList us;
  us.reserve(tensors.size());
  for (const auto& t : tensors) us.push_back(unsqueeze(t, dim));
  return cat(us, dim);
}

namespace {

// Note [Split backward]: the pieces of a split are views of x with one autograd node for all of
// them, whose backward writes every piece's gradient into one buffer of x's shape (zeros only
// where a piece got none). Pieces built from separate narrow()s would each scatter into a
// zero-filled tensor of x's full shape and the engine would then add those together: for a
// GPT's fused q/k/v projection, three fills and two additions of the whole [B, T, 3d] tensor
// per layer instead of one write.
TensorList split_pieces(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  TensorList out;
  out.reserve(sizes.size());
  const Tensor xd = x.detach();
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(xd, dim, off, s));
    off += s;
  }
  if (!needs_grad({x})) return out;
  std::vector<Tensor*> outs;
  for (Tensor& t : out) outs.push_back(&t);
  record("SplitBackward", {x}, outs,
         [shape = x.sizes(), dt = x.dtype(), dev = x.device(), sizes, dim](const TensorList& g,
                                                                           const auto&) {
           Tensor full = Tensor::empty(shape, dt, dev);
           int64_t off = 0;
           for (size_t i = 0; i < sizes.size(); ++i) {
             Tensor part = narrow(full, dim, off, sizes[i]);
             if (g[i].defined()) {
               copy_into(part, g[i]);
             } else {
               part.fill_(0.0);
             }
             off += sizes[i];
           }
           return TensorList{full};
         });
  return out;
}

}  // namespace

TensorList split(const Tensor& x, int64_t split_size, int64_t dim) {
  TD_CHECK(x.defined(), "split: undefined tensor");
  TD_CHECK(x.dim() > 0, "split: cannot split a 0-dim tensor");
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t n = x.size(dim);
  TD_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive ",
           "(or 0 for an empty dim), got ", split_size, " for dim ", dim, " of size ", n);
  if (n == 0) return {narrow(x, dim, 0, 0)};
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < n; s += split_size) sizes.push_back(std::min(split_size, n - s));
  return split_pieces(x, sizes, dim);
}

TensorList split(const Tensor& x, const Shape& sizes, int64_t dim) {
  TD_CHECK(x.defined(), "split: undefined tensor");
  TD_CHECK(x.dim() > 0, "split: cannot split a 0-dim tensor");
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TD_CHECK(s >= 0, "split: negative size ", s, " in ", shape_str(sizes));
    total += s;
  }
  TD_CHECK(total == x.size(dim), "split: sizes ", shape_str(sizes), " sum to ", total, " but dim ",
           dim, " of ", describe(x), " has size ", x.size(dim));
  return split_pieces(x, std::vector<int64_t>(sizes.begin(), sizes.end()), dim);
}

TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  TD_CHECK(x.defined(), "chunk: undefined tensor");
  TD_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  TD_CHECK(x.dim() > 0, "chunk: cannot chunk a 0-dim tensor");
  dim = wrap_dim(dim, x.dim(), "chunk");
  int64_t n = x.size(dim);
  int64_t size = (n + chunks - 1) / chunks;  // torch: pieces of ceil(n / chunks)
  if (n == 0) size = 0;
  return split(x, size, dim);
}

}  // namespace td
