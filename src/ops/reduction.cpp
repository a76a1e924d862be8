#include "tardelli/ops/reduction.h"

#include <cmath>
#include <vector>

#include "ops/reduction_impl.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#if TD_WITH_CUDA
#include "ops/cuda/reduction.h"
#endif

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

// The reductions run on the CPU and, in CUDA builds, on CUDA devices: the kernel-level helpers
// below (sum_any, extremum_any, var, norm) send CUDA tensors to src/ops/cuda/reduction.cpp
// (Note [CUDA dispatch]); the planning, output allocation and autograd stay shared.
void check_device(const Tensor& x, const char* op) {
#if TD_WITH_CUDA
  if (x.is_cuda()) return;
#endif
  ops::check_cpu(x, op);
}

// Sum accumulator: double for floating inputs (deterministic and accurate for any length),
// int64 for integers.
template <typename T>
using sum_acc_t = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, int64_t>;

// Note [Leading reductions]: a sum over the leading dims of a contiguous [R, C] input (a
// linear layer's bias gradient over [tokens, features]) walks the rows in order and accumulates
// whole rows (vectorized along the columns). Splitting only the columns across threads left a
// bias gradient of C <= 1024 columns on one thread. So the rows are cut into nb blocks, a number
// that depends only on R (at most kMaxRowBlocks, at least kMinBlockRows rows each); each block's
// column sums are formed in parallel and the blocks added in block order, so the result does not
// depend on the thread count. The partial sums (nb * C accumulators) are capped by
// kMaxRowBlockPartials; wider inputs keep the column split, which has enough columns then.
constexpr int64_t kMinBlockRows = 64;
constexpr int64_t kMaxRowBlocks = 32;
constexpr int64_t kMaxRowBlockPartials = int64_t{1} << 20;

template <typename T, typename TO>
bool sum_leading_row_blocks(const T* in, int64_t R, int64_t C, TO* o, double scale) {
  const int64_t nb = std::min(kMaxRowBlocks, R / kMinBlockRows);
  if (nb < 2 || nb * C > kMaxRowBlockPartials) return false;
  const int64_t rows = (R + nb - 1) / nb;
  std::vector<sum_acc_t<T>> part(static_cast<size_t>(nb * C), 0);
  cpu::parallel_for(nb, std::max<int64_t>(1, cpu::kGrain / (rows * C)), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      sum_acc_t<T>* acc = part.data() + k * C;
      const int64_t i1 = std::min(R, (k + 1) * rows);
      int64_t i = k * rows;
      auto v = [](T x) { return static_cast<sum_acc_t<T>>(static_cast<acc_t<T>>(x)); };
      for (; i + 4 <= i1; i += 4) {  // four rows per pass over the accumulators
        const T *r0 = in + i * C, *r1 = r0 + C, *r2 = r1 + C, *r3 = r2 + C;
        for (int64_t j = 0; j < C; ++j) acc[j] += (v(r0[j]) + v(r1[j])) + (v(r2[j]) + v(r3[j]));
      }
      for (; i < i1; ++i) {
        const T* row = in + i * C;
        for (int64_t j = 0; j < C; ++j) acc[j] += v(row[j]);
      }
    }
  });
  cpu::parallel_for(C, cpu::kGrain / nb, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      sum_acc_t<T> acc = part[j];
      for (int64_t k = 1; k < nb; ++k) acc += part[k * C + j];
      o[j] = static_cast<TO>(static_cast<acc_t<TO>>(acc * scale));
    }
  });
  return true;
}

// out[r] = sum of row r of a contiguous [rows, n] matrix (or column sums for leading reduce).
template <typename T, typename TO>
void sum_kernel(const Tensor& x, const ops::ReducePlan& p, const Tensor& out, double scale) {
  TO* o = static_cast<TO*>(out.data_ptr());
  if (ops::is_leading_reduce(x, p)) {
    const T* in = static_cast<const T*>(x.data_ptr());
    int64_t R = p.count, C = out.numel();  // not numel / R: with R = 0 that is 0, out unset
    if (sum_leading_row_blocks(in, R, C, o, scale)) return;
    cpu::parallel_for(C, 1024, [&](int64_t b, int64_t e) {
      std::vector<sum_acc_t<T>> acc(e - b, 0);
      for (int64_t i = 0; i < R; ++i) {
        const T* row = in + i * C;
        for (int64_t j = b; j < e; ++j) acc[j - b] += static_cast<acc_t<T>>(row[j]);
      }
      for (int64_t j = b; j < e; ++j)
        o[j] = static_cast<TO>(static_cast<acc_t<TO>>(acc[j - b] * scale));
    });
    return;
  }
  Tensor rows = ops::rows_layout(x, p);
  const T* in = static_cast<const T*>(rows.data_ptr());
  int64_t R = rows.size(0), n = rows.size(1);
  cpu::parallel_for(R, std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(n, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t r = b; r < e; ++r) {
                        const T* row = in + r * n;
                        sum_acc_t<T> s = 0;
                        for (int64_t j = 0; j < n; ++j) s += static_cast<acc_t<T>>(row[j]);
                        o[r] = static_cast<TO>(static_cast<acc_t<TO>>(s * scale));
                      }
                    });
}

// out <- scale * sum of x over p.dims, on x's device.
void sum_any(const Tensor& x, const ops::ReducePlan& p, const Tensor& out, double scale,
             const char* op) {
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::sum_into(x, p, out, scale);
#endif
  TD_DISPATCH_ALL(x.dtype(), op, [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      Tensor xi = x.to(DType::Int64);
      sum_kernel<int64_t, int64_t>(xi, p, out, scale);
    } else if constexpr (std::is_integral_v<T>) {
      sum_kernel<T, int64_t>(x, p, out, scale);
    } else {
      sum_kernel<T, T>(x, p, out, scale);
    }
  });
}

Tensor sum_impl(const Tensor& x, const Shape& dims, bool keepdim, bool mean, const char* op) {
  ops::check_defined(x, op, "input");
  check_device(x, op);
  ops::ReducePlan p = ops::plan_reduce(x, dims, keepdim, op);
  DType ot = x.is_floating_point() ? x.dtype() : DType::Int64;
  if (mean) {
    TD_CHECK(x.is_floating_point(), op, ": expected a floating point input, got ", describe(x));
  }
  Tensor out = Tensor::empty(p.out, ot, x.device());
  if (out.numel() == 0) return out;
  double scale = mean ? 1.0 / static_cast<double>(p.count) : 1.0;
  if (mean && p.count == 0) scale = NAN;
  sum_any(x, p, out, scale, op);
  if (x.is_floating_point() && needs_grad({x})) {
    record(mean ? "MeanBackward" : "SumBackward", {x}, {&out},
           [in = x.sizes(), keep = p.out_keep, scale](const TensorList& g, const auto&) {
             Tensor gg = g[0].reshape(keep);
             if (scale != 1.0) gg = mul(gg, scale);
             return TensorList{expand(gg, in)};
           });
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  return sum_impl(x, dims, keepdim, false, "sum");
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  return sum_impl(x, dims, keepdim, true, "mean");
}

// ---- max / min / amax / argmax ----

namespace {

// Note [Extremum NaN]: like torch, a NaN anywhere in the reduced range is the result (and, for
// max(x, dim), its index): comparisons with NaN are false, so a NaN is taken only by the
// explicit isnan test and, once taken, never replaced.
template <typename A>
inline bool nan_v(A v) {
  if constexpr (std::is_floating_point_v<A>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

template <typename A>
inline bool better(A v, A m, bool is_max) {
  if (nan_v(m)) return false;
  return nan_v(v) || (is_max ? v > m : v < m);
}

// Position (within [b, e)) of the first extremum of a contiguous range.
template <typename T>
int64_t arg_extremum(const T* p, int64_t b, int64_t e, bool is_max) {
  int64_t k = b;
  acc_t<T> m = static_cast<acc_t<T>>(p[b]);
  for (int64_t j = b + 1; j < e; ++j) {
    acc_t<T> v = static_cast<acc_t<T>>(p[j]);
    if (better(v, m, is_max)) {
      m = v;
      k = j;
    }
  }
  return k;
}

// Note [Blocked reductions]: a whole-tensor reduction splits the input into fixed blocks of
// kReduceBlock elements, reduces each (in parallel), then combines the block results serially in
// block order, so the result is bitwise independent of the number of threads.
constexpr int64_t kReduceBlock = 16384;

template <typename Acc, typename BlockF, typename CombineF>
Acc blocked_reduce(int64_t n, Acc init, BlockF block, CombineF combine) {
  int64_t nb = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<Acc> part(nb);
  cpu::parallel_for(nb, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k)
      part[k] = block(k * kReduceBlock, std::min(n, (k + 1) * kReduceBlock));
  });
  Acc r = init;
  for (int64_t k = 0; k < nb; ++k) r = k == 0 ? part[0] : combine(r, part[k]);
  return r;
}

// values (and optionally int64 indices along the reduced row) of a [R, n] row layout.
void extremum_rows(const Tensor& rows, const Tensor& values, const Tensor* indices, bool is_max,
                   const char* op) {
  const int64_t R = rows.size(0), n = rows.size(1);
  TD_DISPATCH_ALL(rows.dtype(), op, [&]<typename T>() {
    const T* in = static_cast<const T*>(rows.data_ptr());
    T* vo = static_cast<T*>(values.data_ptr());
    int64_t* io = indices ? static_cast<int64_t*>(indices->data_ptr()) : nullptr;
    if (R == 1 && !io) {
      int64_t k = blocked_reduce<int64_t>(
          n, 0, [&](int64_t b, int64_t e) { return arg_extremum(in, b, e, is_max); },
          [&](int64_t a, int64_t c) {
            return better(static_cast<acc_t<T>>(in[c]), static_cast<acc_t<T>>(in[a]), is_max) ? c
                                                                                              : a;
          });
      vo[0] = in[k];
      return;
    }
    cpu::parallel_for(R, std::max<int64_t>(1, cpu::kGrain / n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t k = arg_extremum(in + r * n, 0, n, is_max);
        vo[r] = in[r * n + k];
        if (io) io[r] = k;
      }
    });
  });
}

// values (and indices) <- the extremum of x over p.dims (p.count > 0), on x's device.
void extremum_any(const Tensor& x, const ops::ReducePlan& p, const Tensor& values,
                  const Tensor* indices, bool is_max, const char* op) {
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::extremum_into(x, p, values, indices, is_max);
#endif
  extremum_rows(ops::rows_layout(x, p), values, indices, is_max, op);
}

// amax/amin over dims; the gradient is split evenly between tied extrema.
Tensor extremum_dims(const Tensor& x, const Shape& dims, bool keepdim, bool is_max,
                     const char* op) {
  ops::check_defined(x, op, "input");
  check_device(x, op);
  ops::ReducePlan p = ops::plan_reduce(x, dims, keepdim, op);
  Tensor out = Tensor::empty(p.out, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  TD_CHECK(p.count > 0, op, ": cannot reduce over an empty dim of ", describe(x),
           " (the operation has no identity)");
  extremum_any(x, p, out, nullptr, is_max, op);
  if (x.is_floating_point() && needs_grad({x})) {
    record(is_max ? "AmaxBackward" : "AminBackward", {x}, {&out},
           [xd = x.detach(), y = out.detach(), keep = p.out_keep, rd = p.dims](const TensorList& g,
                                                                               const auto&) {
             Tensor w = to_dtype(eq(xd, y.reshape(keep)), g[0].dtype());
             Tensor cnt = sum(w, rd, /*keepdim=*/true);
             return TensorList{mul(w, div(g[0].reshape(keep), cnt))};
           });
  }
  return out;
}

Tensor extremum_all(const Tensor& x, bool is_max, const char* op) {
  ops::check_defined(x, op, "input");
  TD_CHECK(x.numel() > 0, op, ": cannot reduce an empty tensor ", describe(x),
           " (the operation has no identity); use the dim form");
  return extremum_dims(x, {}, false, is_max, op);
}

}  // namespace

Tensor max(const Tensor& x) {
  return extremum_all(x, true, "max");
}
Tensor min(const Tensor& x) {
  return extremum_all(x, false, "min");
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  return extremum_dims(x, dims, keepdim, true, "amax");
}

// all/any count the zero (non-zero) elements with the integer sum, so they run on every backend
// the comparison and sum run on and are exact; the result is never differentiable.
Tensor all(const Tensor& x, const Shape& dims, bool keepdim) {
  ops::check_defined(x, "all", "input");
  Tensor zeros = x.dtype() == DType::Bool ? logical_not(x.detach()) : eq(x.detach(), 0.0);
  return eq(sum(zeros, dims, keepdim), 0.0);
}

Tensor any(const Tensor& x, const Shape& dims, bool keepdim) {
  ops::check_defined(x, "any", "input");
  Tensor nonzero = x.dtype() == DType::Bool ? x.detach() : ne(x.detach(), 0.0);
  return gt(sum(nonzero, dims, keepdim), 0.0);
}

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  const char* op = "max";
  ops::check_defined(x, op, "input");
  check_device(x, op);
  dim = wrap_dim(dim, x.dim(), op);
  ops::ReducePlan p = ops::plan_reduce(x, {dim}, keepdim, op);
  Tensor values = Tensor::empty(p.out, x.dtype(), x.device());
  Tensor indices = Tensor::empty(p.out, DType::Int64, x.device());
  if (values.numel() == 0) return {values, indices};
  TD_CHECK(p.count > 0, op, ": cannot reduce over dim ", dim, " of size 0 of ", describe(x));
  extremum_any(x, p, values, &indices, true, op);
  if (x.is_floating_point() && needs_grad({x})) {
    // Note [Max backward]: the gradient goes to the chosen index of each row. It is written
    // into a zero [rows, n] buffer (the rows_layout order) and permuted back to x's layout.
    Shape perm, rows_shape;
    for (int64_t i = 0; i < x.dim(); ++i) {
      if (i != dim) {
        perm.push_back(i);
        rows_shape.push_back(x.size(i));
      }
    }
    if (x.dim() > 0) {
      perm.push_back(dim);
      rows_shape.push_back(x.size(dim));
    }
    Shape inv(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
    record("MaxBackward", {x}, {&values},
           [idx = indices, R = numel_of(p.out_keep), n = p.count, rows_shape, inv](
               const TensorList& g, const auto&) {
             Tensor gr = g[0].contiguous();
#if TD_WITH_CUDA
             if (gr.is_cuda()) {
               return TensorList{
                   permute(cuda_ops::max_backward_rows(gr, idx, R, n).view(rows_shape), inv)};
             }
#endif
             Tensor z = zeros({R, n}, {gr.dtype(), gr.device()});
             const int64_t* ip = static_cast<const int64_t*>(idx.data_ptr());
             TD_DISPATCH_FLOATING(gr.dtype(), "max_backward", [&]<typename T>() {
               const T* gp = static_cast<const T*>(gr.data_ptr());
               T* zp = static_cast<T*>(z.data_ptr());
               for (int64_t r = 0; r < R; ++r) zp[r * n + ip[r]] = gp[r];
             });
             return TensorList{permute(z.view(rows_shape), inv)};
           });
  }
  return {values, indices};
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  ops::check_defined(x, "argmax", "input");
  if (dim) return max(x.detach(), *dim, keepdim).second;
  TD_CHECK(x.numel() > 0, "argmax: cannot reduce an empty tensor ", describe(x));
  Tensor idx = max(x.detach().reshape({-1}), 0, false).second;
  return keepdim ? idx.reshape(Shape(x.dim(), 1)) : idx;
}

// ---- var / norm ----

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  const char* op = "var";
  ops::check_defined(x, op, "input");
  check_device(x, op);
  ops::check_floating(x, op);
  TD_CHECK(correction >= 0, op, ": correction must be non-negative, got ", correction);
  ops::ReducePlan p = ops::plan_reduce(x, dims, keepdim, op);
  Tensor out = Tensor::empty(p.out, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  // torch's divisor: max(0, N - correction); 0 gives inf/NaN as in torch.
  const double divisor = static_cast<double>(std::max<int64_t>(0, p.count - correction));
  if (p.count == 0) {
    out.fill_(NAN);
#if TD_WITH_CUDA
  } else if (x.is_cuda()) {
    cuda_ops::var_into(x, p, out, divisor);
#endif
  } else {
    Tensor rows = ops::rows_layout(x, p);
    const int64_t R = rows.size(0), n = rows.size(1);
    TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
      const T* in = static_cast<const T*>(rows.data_ptr());
      T* o = static_cast<T*>(out.data_ptr());
      // Two passes in double: mean, then the sum of squared deviations (no cancellation).
      cpu::parallel_for(R, std::max<int64_t>(1, cpu::kGrain / n), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const T* row = in + r * n;
          double s = 0;
          for (int64_t j = 0; j < n; ++j) s += static_cast<float>(row[j]);
          double m = s / static_cast<double>(n), ss = 0;
          for (int64_t j = 0; j < n; ++j) {
            double d = static_cast<float>(row[j]) - m;
            ss += d * d;
          }
          o[r] = static_cast<T>(static_cast<float>(ss / divisor));
        }
      });
    });
  }
  if (needs_grad({x})) {
    record("VarBackward", {x}, {&out},
           [x, keep = p.out_keep, rd = p.dims, divisor](const TensorList& g, const auto&) {
             Tensor centered = sub(x, mean(x, rd, /*keepdim=*/true));
             return TensorList{mul(centered, mul(g[0].reshape(keep), 2.0 / divisor))};
           });
  }
  return out;
}

namespace {

// out <- sqrt of the sum of squares of x (blocked, in double).
void norm_cpu(const Tensor& x, Tensor& out) {
  Tensor in = x.detach().contiguous();
  const int64_t n = in.numel();
  double ss = TD_DISPATCH_FLOATING(x.dtype(), "norm", [&]<typename T>() {
    const T* p = static_cast<const T*>(in.data_ptr());
    return blocked_reduce<double>(
        n, 0.0,
        [&](int64_t b, int64_t e) {
          double s = 0;
          for (int64_t j = b; j < e; ++j) {
            double v = static_cast<float>(p[j]);
            s += v * v;
          }
          return s;
        },
        [](double a, double c) { return a + c; });
  });
  out.fill_(std::sqrt(ss));
}

}  // namespace

Tensor norm(const Tensor& x) {
  const char* op = "norm";
  ops::check_defined(x, op, "input");
  check_device(x, op);
  ops::check_floating(x, op);
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
#if TD_WITH_CUDA
  if (x.is_cuda()) cuda_ops::norm_into(x, out);
#endif
  if (x.is_cpu()) norm_cpu(x, out);
  if (needs_grad({x})) {
    // d|x|/dx = x / |x|; at x == 0 the subgradient 0 is used (torch does the same).
    record("NormBackward", {x}, {&out}, [x, y = out.detach()](const TensorList& g, const auto&) {
      if (y.item_double() == 0.0) return TensorList{zeros_like(x)};
      return TensorList{mul(x, div(g[0], y))};
    });
  }
  return out;
}

}  // namespace td
