#include "tardelli/ops/loss.h"

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"
#if TD_WITH_CUDA
#include "ops/cuda/loss.h"
#endif

// Note [Fused cross entropy]: logits are viewed as contiguous [rows, C]. The forward makes one
// read of each row for its max and logsumexp (fp32 for every dtype) and saves only the fp32
// logsumexp per row (as max and log-sum, two floats); the backward recomputes softmax = exp(x -
// lse) row by row, so no [rows, C] probability tensor ever exists (C is the vocabulary: this is the
// largest activation of a language model). With label smoothing eps, torch's formula is
//   loss_r = (1 - eps) * (lse - x[t]) + eps / C * sum_c (lse - x[c])
//   dloss_r/dx[c] = softmax[c] - (1 - eps) * [c == t] - eps / C.
// Ignored rows contribute 0 and are not counted by the Mean reduction (all ignored: 0/0 = NaN,
// as in torch). The total is summed in row order in double: deterministic.

namespace td {

using autograd::needs_grad;
using autograd::record;

using cpu::load_row;
using cpu::vexp;

namespace {

int64_t row_grain(int64_t n) {
  return std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(n, 1));
}

// Per-row losses (0 for ignored rows) and logsumexp.
template <typename T>
void ce_forward_rows(const T* logits, const int64_t* target, int64_t rows, int64_t C,
                     int64_t ignore_index, float eps, float* loss, float* shift_out,
                     float* log_s_out) {
  cpu::parallel_for(rows, row_grain(C), [&](int64_t b, int64_t e) {
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : C);
    for (int64_t r = b; r < e; ++r) {
      const float* x = load_row(logits + r * C, C, scratch.data());
      float shift = cpu::softmax_shift(x, C);
      float s = 0.0f, sx = 0.0f;
#pragma omp simd reduction(+ : s, sx)
      for (int64_t j = 0; j < C; ++j) {
        s += vexp(x[j] - shift);
        sx += x[j] - shift;
      }
      float log_s = std::log(s);
      shift_out[r] = shift;
      log_s_out[r] = log_s;
      int64_t t = target[r];
      if (t == ignore_index) {
        loss[r] = 0.0f;
        continue;
      }
      // lse - x[t] as log(s) - (x[t] - max): exact subtraction first (see softmax.cpp).
      float nll = log_s - (x[t] - shift);
      // sum_c (lse - x[c]) = C * log(s) - sum_c (x[c] - shift): both terms stay small.
      float smooth = static_cast<float>(C) * log_s - sx;
      loss[r] = eps == 0.0f ? nll : (1.0f - eps) * nll + eps / static_cast<float>(C) * smooth;
    }
  });
}

// dlogits for rows; `g` is per row (stride 1) or one value (stride 0), already scaled.
template <typename T>
void ce_backward_rows(const T* logits, const int64_t* target, const float* shift,
                      const float* log_s, const float* g, int64_t g_stride, int64_t rows, int64_t C,
                      int64_t ignore_index, float eps, T* dx) {
  cpu::parallel_for(rows, row_grain(C), [&](int64_t b, int64_t e) {
    constexpr bool kFloat = std::is_same_v<T, float>;
    std::vector<float> xs(kFloat ? 0 : C), os(kFloat ? 0 : C);
    const float off = eps / static_cast<float>(C);
    for (int64_t r = b; r < e; ++r) {
      float* o = kFloat ? reinterpret_cast<float*>(dx + r * C) : os.data();
      int64_t t = target[r];
      if (t == ignore_index) {
        for (int64_t j = 0; j < C; ++j) o[j] = 0.0f;
      } else {
        const float* x = load_row(logits + r * C, C, xs.data());
        const float gr = g[r * g_stride], m = shift[r], ls = log_s[r];
        for (int64_t j = 0; j < C; ++j) o[j] = (vexp((x[j] - m) - ls) - off) * gr;
        o[t] -= (1.0f - eps) * gr;
      }
      if constexpr (!kFloat) {
        for (int64_t j = 0; j < C; ++j) dx[r * C + j] = static_cast<T>(o[j]);
      }
    }
  });
}

struct CeSaved {
  Tensor logits;                // contiguous [rows, C], detached
  std::vector<int64_t> target;  // CPU
  Tensor target_dev;            // CUDA: int64 [rows] on the logits' device
  // The logsumexp of each row as max + log(sum exp(x - max)), both fp32 [rows]: kept apart so
  // that x - lse is formed as (x - max) - log_s without rounding lse to max's spacing.
  Tensor shift, log_s;
  int64_t count = 0;  // rows not ignored
};

Tensor ce_backward(const Tensor& grad, const CeSaved& s, const Shape& logits_shape,
                   int64_t ignore_index, Reduction reduction, double label_smoothing) {
#if TD_WITH_CUDA
  if (s.logits.is_cuda()) {
    return cuda_ops::cross_entropy_backward(grad, s.logits, s.target_dev, s.shift, s.log_s, s.count,
                                            ignore_index, reduction, label_smoothing, logits_shape);
  }
#endif
  const int64_t C = s.logits.size(1), rows = s.logits.size(0);
  std::vector<float> g = to_vector<float>(grad);
  int64_t g_stride = 1;
  if (reduction != Reduction::None) {
    g_stride = 0;
    // Mean over zero rows: every row is ignored, so nothing reads the (infinite) scale.
    double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(s.count) : 1.0;
    g[0] = static_cast<float>(g[0] * scale);
  }
  Tensor dx = Tensor::empty(logits_shape, s.logits.dtype(), s.logits.device());
  if (rows == 0) return dx;
  TD_DISPATCH_FLOATING(s.logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
    ce_backward_rows<T>(static_cast<const T*>(s.logits.data_ptr()), s.target.data(),
                        s.shift.data_ptr<float>(), s.log_s.data_ptr<float>(), g.data(), g_stride,
                        rows, C, ignore_index, static_cast<float>(label_smoothing),
                        static_cast<T*>(dx.data_ptr()));
  });
  return dx;
}

// The CPU forward: fills s (target, statistics, count) and returns the reduced loss.
Tensor ce_forward_cpu(const Tensor& logits, const Tensor& target, const Shape& batch,
                      int64_t ignore_index, Reduction reduction, double label_smoothing,
                      CeSaved& s);

}  // namespace

namespace {

void check_sum_and_grad_args(const char* op, const Tensor& logits, const Tensor& target) {
  ops::check_defined(logits, op, "input");
  ops::check_defined(target, op, "target");
  TD_CHECK(logits.dim() == 2 && logits.dtype() == DType::Float32 && logits.is_contiguous(), op,
           ": expected contiguous fp32 logits [N, C], got ", describe(logits));
  TD_CHECK(target.dim() == 1 && target.size(0) == logits.size(0) && is_integral(target.dtype()), op,
           ": expected an int target [", logits.size(0), "], got ", describe(target));
  ops::check_same_device(logits, target, op);
}

#if TD_WITH_CUDA
// The CUDA forward and backward kernels, then the gradient over the logits; the sum stays on
// the device. `deferred`: the targets' check too (Note [Deferred device checks]).
Tensor sum_and_grad_cuda(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                         bool deferred) {
  CeSaved s;
  s.logits = logits;
  Tensor loss = cuda_ops::cross_entropy_forward(logits, target, ignore_index, Reduction::Sum, 0.0,
                                                {logits.size(0)}, s.target_dev, s.shift, s.log_s,
                                                s.count, deferred);
  Tensor one = scalar_tensor(1.0, DType::Float32, logits.device());
  Tensor dl = ce_backward(one, s, logits.sizes(), ignore_index, Reduction::Sum, 0.0);
  copy_into(logits, dl);
  return loss;
}
#endif

}  // namespace

Tensor cross_entropy_sum_and_grad_on_device_(const Tensor& logits, const Tensor& target,
                                             int64_t ignore_index) {
  const char* op = "cross_entropy_sum_and_grad_";
  check_sum_and_grad_args(op, logits, target);
#if TD_WITH_CUDA
  if (logits.is_cuda()) return sum_and_grad_cuda(logits, target, ignore_index, true);
#endif
  return scalar_tensor(cross_entropy_sum_and_grad_(logits, target, ignore_index), DType::Float32,
                       logits.device());
}

double cross_entropy_sum_and_grad_(const Tensor& logits, const Tensor& target,
                                   int64_t ignore_index) {
  const char* op = "cross_entropy_sum_and_grad_";
  check_sum_and_grad_args(op, logits, target);
#if TD_WITH_CUDA
  if (logits.is_cuda()) return sum_and_grad_cuda(logits, target, ignore_index, false).item_double();
#endif
  ops::check_cpu(logits, op);
  const int64_t rows = logits.size(0), C = logits.size(1);
  std::vector<int64_t> t = to_vector<int64_t>(target);
  for (int64_t r = 0; r < rows; ++r) {
    TD_CHECK(t[r] == ignore_index || (t[r] >= 0 && t[r] < C), op, ": target ", t[r],
             " at position ", r, " is out of range for ", C, " classes (valid: 0..", C - 1,
             ", or ignore_index ", ignore_index, ")");
  }
  std::vector<double> loss(static_cast<size_t>(rows), 0.0);
  float* base = logits.data_ptr<float>();
  cpu::parallel_for(rows, row_grain(C), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* x = base + r * C;
      if (t[r] == ignore_index) {
        std::fill(x, x + C, 0.0f);
        continue;
      }
      const float shift = cpu::softmax_shift(x, C);
      const float xt = x[t[r]] - shift;
      const float s = cpu::exp_shift_sum(x, x, C, shift);
      loss[r] = static_cast<double>(std::log(s)) - static_cast<double>(xt);
      const float inv = 1.0f / s;
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) x[j] *= inv;
      x[t[r]] -= 1.0f;
    }
  });
  double total = 0.0;
  for (double l : loss) total += l;  // row order: deterministic
  return total;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     Reduction reduction, double label_smoothing) {
  const char* op = "cross_entropy";
  ops::check_defined(logits, op, "input");
  ops::check_defined(target, op, "target");
  ops::check_floating(logits, op);
  TD_CHECK(logits.dim() >= 1, op, ": input must have a class dim [..., C], got ", describe(logits));
  TD_CHECK(is_integral(target.dtype()), op, ": target must be int32 or int64 class indices, got ",
           describe(target));
  const int64_t C = logits.sizes().back();
  TD_CHECK(C > 0, op, ": input ", describe(logits), " has no classes");
  Shape batch(logits.sizes().begin(), logits.sizes().end() - 1);
  TD_CHECK(target.sizes() == batch, op, ": target ", describe(target), " must have shape ",
           shape_str(batch), " (input ", describe(logits), " without its class dim)");
  TD_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
           ": label_smoothing must be in [0, 1], got ", label_smoothing);

  CeSaved s;
  Tensor out;
#if TD_WITH_CUDA
  if (logits.is_cuda()) {
    s.logits = logits.detach().contiguous().view({numel_of(batch), C});
    out =
        cuda_ops::cross_entropy_forward(s.logits, target, ignore_index, reduction, label_smoothing,
                                        batch, s.target_dev, s.shift, s.log_s, s.count);
  } else
#endif
  {
    out = ce_forward_cpu(logits, target, batch, ignore_index, reduction, label_smoothing, s);
  }
  if (needs_grad({logits})) {
    record(
        "CrossEntropyBackward", {logits}, {&out},
        [s = std::move(s), shape = logits.sizes(), ignore_index, reduction, label_smoothing](
            const TensorList& g, const auto&) {
          return TensorList{ce_backward(g[0], s, shape, ignore_index, reduction, label_smoothing)};
        });
  }
  return out;
}

namespace {

Tensor ce_forward_cpu(const Tensor& logits, const Tensor& target, const Shape& batch,
                      int64_t ignore_index, Reduction reduction, double label_smoothing,
                      CeSaved& s) {
  const char* op = "cross_entropy";
  ops::check_cpu(logits, op);
  ops::check_cpu(target, op);
  const int64_t C = logits.sizes().back();
  const int64_t rows = numel_of(batch);
  s.logits = logits.detach().contiguous().view({rows, C});
  s.target = to_vector<int64_t>(target);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = s.target[r];
    if (t == ignore_index) continue;
    TD_CHECK(t >= 0 && t < C, op, ": target ", t, " at position ", r, " is out of range for ", C,
             " classes (valid: 0..", C - 1, ", or ignore_index ", ignore_index, ")");
    ++s.count;
  }
  s.shift = Tensor::empty({rows}, DType::Float32, logits.device());
  s.log_s = Tensor::empty({rows}, DType::Float32, logits.device());
  std::vector<float> loss(rows);
  if (rows > 0) {
    TD_DISPATCH_FLOATING(logits.dtype(), op, [&]<typename T>() {
      ce_forward_rows<T>(static_cast<const T*>(s.logits.data_ptr()), s.target.data(), rows, C,
                         ignore_index, static_cast<float>(label_smoothing), loss.data(),
                         s.shift.data_ptr<float>(), s.log_s.data_ptr<float>());
    });
  }

  Tensor out;
  if (reduction == Reduction::None) {
    out = from_vector<float>(loss, batch);
    if (logits.dtype() != DType::Float32) out = out.to(logits.dtype());
  } else {
    double total = 0.0;
    for (float l : loss) total += l;
    if (reduction == Reduction::Mean) total /= static_cast<double>(s.count);  // 0/0: NaN
    out = scalar_tensor(total, logits.dtype(), logits.device());
  }
  return out;
}

}  // namespace

}  // namespace td
