#include "tardelli/ops/reduction.h"

#include <cmath>

#include "ops/reduction_impl.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

// Sum accumulator: double for floating inputs (deterministic and accurate for any length),
// int64 for integers.
template <typename T>
using sum_acc_t = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, int64_t>;

// out[r] = sum of row r of a contiguous [rows, n] matrix (or column sums for leading reduce).
template <typename T, typename TO>
void sum_kernel(const Tensor& x, const ops::ReducePlan& p, const Tensor& out, double scale) {
  TO* o = static_cast<TO*>(out.data_ptr());
  if (ops::is_leading_reduce(x, p)) {
    const T* in = static_cast<const T*>(x.data_ptr());
    int64_t R = p.count, C = x.numel() / std::max<int64_t>(R, 1);
    cpu::parallel_for(C, 1024, [&](int64_t b, int64_t e) {
      std::vector<sum_acc_t<T>> acc(e - b, 0);
      for (int64_t i = 0; i < R; ++i) {
        const T* row = in + i * C;
        for (int64_t j = b; j < e; ++j) acc[j - b] += static_cast<acc_t<T>>(row[j]);
      }
      for (int64_t j = b; j < e; ++j) o[j] = static_cast<TO>(static_cast<acc_t<TO>>(acc[j - b] * scale));
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

Tensor sum_impl(const Tensor& x, const Shape& dims, bool keepdim, bool mean, const char* op) {
  ops::check_defined(x, op, "input");
  ops::check_cpu(x, op);
  ops::ReducePlan p = ops::plan_reduce(x, dims, keepdim, op);
  DType ot = x.is_floating_point() ? x.dtype() : DType::Int64;
  if (mean) {
    TD_CHECK(x.is_floating_point(), op, ": expected a floating point input, got ", describe(x));
  }
  Tensor out = Tensor::empty(p.out, ot, x.device());
  if (out.numel() == 0) return out;
  double scale = mean ? 1.0 / static_cast<double>(p.count) : 1.0;
  if (mean && p.count == 0) scale = NAN;
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

}  // namespace td
