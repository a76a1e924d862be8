#include "tardelli/ops/softmax.h"

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/view.h"
#if TD_WITH_CUDA
#include "ops/cuda/softmax.h"
#endif

// Note [Row kernels]: softmax and its backward work on contiguous rows of the reduced dim. The
// last dim of a contiguous tensor is used in place; any other dim (or a strided input) is first
// moved last by a transposed copy, which costs one extra pass but keeps a single, vectorized
// kernel. Each row is converted to a float scratch row (bf16/f16), reduced with
// `omp simd reduction` (a fixed 8-lane order: deterministic for a build, independent of the
// thread count) and written back. Rows are split across threads, one row per task.

namespace td {

using autograd::needs_grad;
using autograd::record;

using cpu::load_row;
using cpu::vexp;

namespace {

template <typename T>
void store_row(const float* src, int64_t n, T* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<T>(src[j]);
}

int64_t row_grain(int64_t n) {
  return std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(n, 1));
}

// out[r, :] = softmax or log_softmax of in[r, :], both contiguous [rows, n].
template <typename T, bool Log>
void softmax_rows(const T* in, T* out, int64_t rows, int64_t n) {
  cpu::parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    constexpr bool kFloat = std::is_same_v<T, float>;
    std::vector<float> xs(kFloat ? 0 : n), ys(kFloat ? 0 : n);
    for (int64_t r = b; r < e; ++r) {
      const float* x = load_row(in + r * n, n, xs.data());
      float* y = kFloat ? reinterpret_cast<float*>(out + r * n) : ys.data();
      const float shift = cpu::softmax_shift(x, n);
      float s = 0.0f;
      if constexpr (Log) {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; ++j) s += vexp(x[j] - shift);
        // (x - max) - log(s), not x - (max + log(s)): for large logits max + log(s) would be
        // rounded to the spacing of max (6e-5 at 1000), the same loss torch avoids.
        float log_s = std::log(s);
        for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - shift) - log_s;
      } else {
        s = cpu::exp_shift_sum(x, y, n, shift);
        float inv = 1.0f / s;
        for (int64_t j = 0; j < n; ++j) y[j] *= inv;
      }
      if constexpr (!kFloat) store_row(y, n, out + r * n);
    }
  });
}

// dx = y * (g - sum(g * y)) (softmax) or g - exp(y) * sum(g) (log_softmax), rows as above.
template <typename T, bool Log>
void softmax_backward_rows(const T* gin, const T* yin, T* out, int64_t rows, int64_t n) {
  cpu::parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    constexpr bool kFloat = std::is_same_v<T, float>;
    std::vector<float> gs(kFloat ? 0 : n), ys(kFloat ? 0 : n), os(kFloat ? 0 : n);
    for (int64_t r = b; r < e; ++r) {
      const float* g = load_row(gin + r * n, n, gs.data());
      const float* y = load_row(yin + r * n, n, ys.data());
      float* o = kFloat ? reinterpret_cast<float*>(out + r * n) : os.data();
      float s = 0.0f;
      if constexpr (Log) {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; ++j) s += g[j];
        for (int64_t j = 0; j < n; ++j) o[j] = g[j] - vexp(y[j]) * s;
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; ++j) s += g[j] * y[j];
        for (int64_t j = 0; j < n; ++j) o[j] = y[j] * (g[j] - s);
      }
      if constexpr (!kFloat) store_row(o, n, out + r * n);
    }
  });
}

// Moves `dim` last and makes the result contiguous (a no-op for a contiguous last dim).
Tensor rows_last(const Tensor& t, int64_t dim) {
  Tensor d = t.detach();
  if (dim != t.dim() - 1) d = transpose(d, dim, t.dim() - 1);
  return d.contiguous();
}

// Inverse of rows_last: a contiguous tensor in the original dim order.
Tensor rows_restore(const Tensor& t, int64_t dim) {
  if (dim == t.dim() - 1) return t;
  return transpose(t, dim, t.dim() - 1).contiguous();
}

template <bool Log>
Tensor softmax_forward(const Tensor& x, int64_t dim, const char* op) {
  ops::check_defined(x, op, "input");
  ops::check_floating(x, op);
  if (x.dim() == 0) return softmax_forward<Log>(x.detach().view({1}), 0, op).view({});
  int64_t d = wrap_dim(dim, x.dim(), op);
#if TD_WITH_CUDA
  if (x.is_cuda()) return rows_restore(cuda_ops::softmax_rows(rows_last(x, d), Log), d);
#endif
  ops::check_cpu(x, op);
  Tensor xr = rows_last(x, d);
  Tensor yr = Tensor::empty(xr.sizes(), x.dtype(), x.device());
  int64_t n = x.size(d);
  if (xr.numel() > 0) {
    TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
      softmax_rows<T, Log>(static_cast<const T*>(xr.data_ptr()), static_cast<T*>(yr.data_ptr()),
                           xr.numel() / n, n);
    });
  }
  return rows_restore(yr, d);
}

template <bool Log>
Tensor softmax_backward_impl(const Tensor& grad, const Tensor& y, int64_t dim, const char* op) {
  ops::check_defined(grad, op, "grad");
  ops::check_defined(y, op, "output");
  ops::check_floating(y, op);
  TD_CHECK(grad.sizes() == y.sizes(), op, ": grad ", describe(grad), " and output ", describe(y),
           " must have the same shape");
  if (y.dim() == 0) {
    return softmax_backward_impl<Log>(grad.detach().view({1}), y.detach().view({1}), 0, op)
        .view({});
  }
  int64_t d = wrap_dim(dim, y.dim(), op);
  Tensor g = grad.dtype() == y.dtype() ? grad.detach() : to_dtype(grad.detach(), y.dtype());
#if TD_WITH_CUDA
  if (y.is_cuda()) {
    ops::check_same_device(y, grad, op);
    return rows_restore(cuda_ops::softmax_backward_rows(rows_last(g, d), rows_last(y, d), Log), d);
  }
#endif
  ops::check_cpu(grad, op);
  ops::check_cpu(y, op);
  Tensor gr = rows_last(g, d), yr = rows_last(y, d);
  Tensor dx = Tensor::empty(yr.sizes(), y.dtype(), y.device());
  int64_t n = y.size(d);
  if (yr.numel() > 0) {
    TD_DISPATCH_FLOATING(y.dtype(), op, [&]<typename T>() {
      softmax_backward_rows<T, Log>(static_cast<const T*>(gr.data_ptr()),
                                    static_cast<const T*>(yr.data_ptr()),
                                    static_cast<T*>(dx.data_ptr()), yr.numel() / n, n);
    });
  }
  return rows_restore(dx, d);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor out = softmax_forward<false>(x, dim, "softmax");
  if (needs_grad({x})) {
    record("SoftmaxBackward", {x}, {&out},
           [y = out.detach(), dim](const TensorList& g, const auto&) {
             return TensorList{softmax_backward(g[0], y, dim)};
           });
  }
  return out;
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor out = softmax_forward<true>(x, dim, "log_softmax");
  if (needs_grad({x})) {
    record("LogSoftmaxBackward", {x}, {&out},
           [y = out.detach(), dim](const TensorList& g, const auto&) {
             return TensorList{log_softmax_backward(g[0], y, dim)};
           });
  }
  return out;
}

Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_backward_impl<false>(grad, y, dim, "softmax_backward");
}

Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_backward_impl<true>(grad, y, dim, "log_softmax_backward");
}

}  // namespace td
