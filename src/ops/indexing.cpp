#include "tardelli/ops/indexing.h"

#include <cstring>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "ops/elementwise_impl.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"
#if TD_WITH_CUDA
#include "ops/cuda/indexing.h"
#include "ops/cuda/indexing_ew.h"
#endif

namespace td {

using autograd::needs_grad;
using autograd::record;
using ops::split3;
using ops::Split3;

namespace {

Tensor as_type(const Tensor& t, DType dt) {
  return t.dtype() == dt ? t : to_dtype(t, dt);
}

void check_bool_mask(const Tensor& m, const char* op, const char* arg) {
  ops::check_defined(m, op, arg);
  TD_CHECK(m.dtype() == DType::Bool, op, ": ", arg, " must be a bool tensor, got ", describe(m));
}

// Shared by tril/triu: keeps element (i, j) of each trailing matrix iff keep(j - i).
// `upper` and `k` describe `keep` for the CUDA backend (keep(d) == (upper ? d >= k : d <= k)).
template <typename Keep>
Tensor triangle(const char* op, const Tensor& x, bool upper, int64_t k, Keep keep) {
  ops::check_defined(x, op, "input");
  if (!ops::on_cuda_backend(x)) ops::check_cpu(x, op);
  TD_CHECK(x.dim() >= 2, op, ": input must have at least 2 dims, got ", describe(x));
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
#if TD_WITH_CUDA
  if (x.is_cuda()) {
    cuda_ops::triangle_into(out, x.detach(), upper, k);
    return out;
  }
#endif
  Tensor in = x.detach().contiguous();
  const int64_t R = x.size(-2), C = x.size(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(C, 1);
  if (x.numel() == 0) return out;
  const size_t isz = x.element_size();
  const char* src = static_cast<const char*>(in.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  cpu::parallel_for(rows, std::max<int64_t>(1, cpu::kGrain / C), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t i = r % R;
      const char* s = src + r * C * isz;
      char* d = dst + r * C * isz;
      // Bytes of zero are 0 for every dtype we have (ints, IEEE floats, bool).
      for (int64_t j = 0; j < C; ++j) {
        if (keep(j - i)) {
          std::memcpy(d + j * isz, s + j * isz, isz);
        } else {
          std::memset(d + j * isz, 0, isz);
        }
      }
    }
  });
  return out;
}

// Validates a 1-D index against a dim of size n and returns it as int64 values.
std::vector<int64_t> checked_index(const Tensor& index, int64_t n, int64_t dim, const char* op) {
  ops::check_defined(index, op, "index");
  ops::check_cpu(index, op);
  TD_CHECK(index.dim() <= 1, op, ": index must be 1-D, got ", describe(index));
  TD_CHECK(is_integral(index.dtype()), op, ": index must be int32 or int64, got ", describe(index));
  std::vector<int64_t> idx = to_vector<int64_t>(index);
  for (int64_t v : idx) {
    TD_CHECK(v >= 0 && v < n, op, ": index ", v, " is out of range for dim ", dim, " of size ", n);
  }
  return idx;
}

// out[o, idx[i], c] += src[o, i, c], deterministically: the flat (o, c) range is split across
// threads, and every output element sums its contributions in index order, whatever the number
// of threads. T is the (fp32 for bf16/f16) accumulation type; out and src are contiguous.
template <typename T>
void index_add_kernel(T* out, const T* src, const std::vector<int64_t>& idx, const Split3& g) {
  const int64_t n = static_cast<int64_t>(idx.size());
  const int64_t work = g.outer * g.inner;
  int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(n, 1));
  cpu::parallel_for(work, grain, [&](int64_t b, int64_t e) {
    int64_t f = b;
    while (f < e) {
      int64_t o = f / g.inner, c0 = f % g.inner;
      int64_t c1 = std::min(g.inner, c0 + (e - f));
      T* ob = out + o * g.mid * g.inner;
      const T* sb = src + o * n * g.inner;
      for (int64_t i = 0; i < n; ++i) {
        T* orow = ob + idx[i] * g.inner;
        const T* srow = sb + i * g.inner;
        for (int64_t c = c0; c < c1; ++c) orow[c] += srow[c];
      }
      f += c1 - c0;
    }
  });
}

}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const char* op = "masked_fill";
  ops::check_defined(x, op, "input");
  check_bool_mask(mask, op, "mask");
  ops::check_same_device(x, mask, op);
  if (!ops::on_cuda_backend(x)) ops::check_cpu(x, op);
  TD_CHECK(broadcast_shapes(x.sizes(), mask.sizes(), op) == x.sizes(), op, ": mask ",
           shape_str(mask.sizes()), " does not broadcast to the input ", shape_str(x.sizes()));
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (ops::on_cuda_backend(x)) {
#if TD_WITH_CUDA
    cuda_ops::masked_fill_into(out, x.detach(), mask, value);
#endif
  } else {
    TD_DISPATCH_ALL(x.dtype(), op, [&]<typename T>() {
      auto v = static_cast<acc_t<T>>(value);
      cpu::map<T, T, bool>(out, [v](auto xv, bool m) { return m ? v : xv; }, {x.detach(), mask});
    });
  }
  if (needs_grad({x})) {
    record("MaskedFillBackward", {x}, {&out}, [mask](const TensorList& g, const auto&) {
      return TensorList{masked_fill(g[0], mask, 0.0)};
    });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const char* op = "where";
  check_bool_mask(cond, op, "condition");
  ops::check_defined(a, op, "input");
  ops::check_defined(b, op, "other");
  ops::check_same_device(cond, a, op);
  ops::check_same_device(a, b, op);
  if (!ops::on_cuda_backend(cond)) ops::check_cpu(cond, op);
  Shape shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), op), b.sizes(), op);
  DType rt = promote_types(a.dtype(), b.dtype());
  Tensor ac = as_type(a.detach(), rt), bc = as_type(b.detach(), rt);
  Tensor out = Tensor::empty(shape, rt, a.device());
  if (ops::on_cuda_backend(out)) {
#if TD_WITH_CUDA
    cuda_ops::where_into(out, cond, ac, bc);
#endif
  } else {
    TD_DISPATCH_ALL(rt, op, [&]<typename T>() {
      cpu::map<T, bool, T, T>(out, [](bool c, auto u, auto v) { return c ? u : v; },
                              {cond, ac, bc});
    });
  }
  if (is_floating(rt) && needs_grad({a, b})) {
    record("WhereBackward", {a, b}, {&out}, [cond, a, b](const TensorList& g, const auto& need) {
      Tensor ga, gb;
      if (need[0]) ga = ops::reduce_grad(masked_fill(g[0], logical_not(cond), 0.0), a);
      if (need[1]) gb = ops::reduce_grad(masked_fill(g[0], cond, 0.0), b);
      return TensorList{ga, gb};
    });
  }
  return out;
}

Tensor tril(const Tensor& x, int64_t k) {
  Tensor out = triangle("tril", x, false, k, [k](int64_t d) { return d <= k; });
  if (needs_grad({x})) {
    record("TrilBackward", {x}, {&out},
           [k](const TensorList& g, const auto&) { return TensorList{tril(g[0], k)}; });
  }
  return out;
}

Tensor triu(const Tensor& x, int64_t k) {
  Tensor out = triangle("triu", x, true, k, [k](int64_t d) { return d >= k; });
  if (needs_grad({x})) {
    record("TriuBackward", {x}, {&out},
           [k](const TensorList& g, const auto&) { return TensorList{triu(g[0], k)}; });
  }
  return out;
}

namespace {

// The values of index_select (dim wrapped, x checked), on x's device.
Tensor index_select_values(const Tensor& x, int64_t dim, const Tensor& index, const char* op) {
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::index_select(x, dim, index);
#endif
  ops::check_cpu(x, op);
  std::vector<int64_t> idx = checked_index(index, x.size(dim), dim, op);
  Shape os = x.sizes();
  os[dim] = static_cast<int64_t>(idx.size());
  Tensor out = Tensor::empty(os, x.dtype(), x.device());
  if (out.numel() > 0) {
    Tensor in = x.detach().contiguous();
    Split3 g = split3(x.sizes(), dim);
    const int64_t n = static_cast<int64_t>(idx.size());
    const size_t row_bytes = static_cast<size_t>(g.inner) * x.element_size();
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    cpu::parallel_for(
        g.outer * n, std::max<int64_t>(1, cpu::kGrain / g.inner), [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            int64_t o = r / n, i = r % n;
            std::memcpy(dst + r * row_bytes, src + (o * g.mid + idx[i]) * row_bytes, row_bytes);
          }
        });
  }
  return out;
}

// The values of index_add (dim wrapped; x and src checked, on one device), on x's device.
Tensor index_add_values(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                        const char* op) {
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::index_add(x, dim, index, src);
#endif
  ops::check_cpu(x, op);
  std::vector<int64_t> idx = checked_index(index, x.size(dim), dim, op);
  Shape want = x.sizes();
  want[dim] = static_cast<int64_t>(idx.size());
  TD_CHECK(src.sizes() == want, op, ": source ", describe(src), " must have shape ",
           shape_str(want), " (the input ", shape_str(x.sizes()), " with dim ", dim,
           " of the index's length ", idx.size(), ")");
  return TD_DISPATCH_NUMERIC(x.dtype(), op, [&]<typename T>() {
    // bf16/f16 accumulate in fp32 and round once at the end.
    using A = acc_t<T>;
    DType at = dtype_of<A>::value;
    Tensor acc = Tensor::empty(x.sizes(), at, x.device());
    copy_into(acc, x.detach());
    if (acc.numel() > 0 && !idx.empty()) {
      Tensor s = as_type(src.detach(), at).contiguous();
      index_add_kernel<A>(static_cast<A*>(acc.data_ptr()), static_cast<const A*>(s.data_ptr()), idx,
                          split3(x.sizes(), dim));
    }
    return as_type(acc, x.dtype());
  });
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "index_select";
  ops::check_defined(x, op, "input");
  TD_CHECK(x.dim() >= 1, op, ": input must have at least 1 dim, got ", describe(x));
  dim = wrap_dim(dim, x.dim(), op);
  Tensor out = index_select_values(x, dim, index, op);
  if (x.is_floating_point() && needs_grad({x})) {
    record(
        "IndexSelectBackward", {x}, {&out},
        [in = x.sizes(), dim, index](const TensorList& g, const auto&) {
          return TensorList{index_add(zeros(in, {g[0].dtype(), g[0].device()}), dim, index, g[0])};
        });
  }
  return out;
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "index_add";
  ops::check_defined(x, op, "input");
  ops::check_defined(src, op, "source");
  ops::check_same_device(x, src, op);
  ops::check_same_dtype(x, src, op);
  TD_CHECK(x.dim() >= 1, op, ": input must have at least 1 dim, got ", describe(x));
  dim = wrap_dim(dim, x.dim(), op);
  Tensor out = index_add_values(x, dim, index, src, op);
  if (x.is_floating_point() && needs_grad({x, src})) {
    record("IndexAddBackward", {x, src}, {&out},
           [dim, index](const TensorList& g, const auto& need) {
             return TensorList{need[0] ? g[0] : Tensor(),
                               need[1] ? index_select(g[0], dim, index) : Tensor()};
           });
  }
  return out;
}

}  // namespace td
