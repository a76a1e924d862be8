#include "tardelli/ops/rotary.h"

#include <cmath>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/autograd/function.h"
#if TD_WITH_CUDA
#include "ops/cuda/rotary.h"
#endif

// Note [Rotary layout]: x is [B, T, H, D] with any strides (q/k usually come out of a fused
// QKV projection as strided views), so the kernel reads x through its strides and writes a
// contiguous output: no copy of x first. Each (b, t, h) row is one task; within a row, pair
// (i, i + D/2) is rotated by the angle of (t, i). The rotation is orthogonal, so its backward is
// the same kernel with the angle negated (inverse = true).

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

void check_rotary_args(const char* op, const Tensor& x, const Tensor& cos, const Tensor& sin) {
  ops::check_defined(x, op, "x");
  ops::check_defined(cos, op, "cos");
  ops::check_defined(sin, op, "sin");
  ops::check_floating(x, op);
  TD_CHECK(x.dim() == 4, op, ": x must be [batch, seq, heads, head_dim], got ", describe(x));
  const int64_t T = x.size(1), D = x.size(3);
  TD_CHECK(D % 2 == 0, op, ": head_dim must be even, got ", D, " (x ", describe(x), ")");
  for (const Tensor* c : {&cos, &sin}) {
    const char* name = c == &cos ? "cos" : "sin";
    TD_CHECK(c->dtype() == DType::Float32, op, ": ", name, " must be float32, got ", describe(*c));
    TD_CHECK(c->sizes() == (Shape{T, D / 2}), op, ": ", name, " ", describe(*c),
             " must be [seq, head_dim/2] = ", shape_str({T, D / 2}), " for x ", describe(x));
  }
}

template <typename T>
void rotary_rows(const Tensor& x, const float* cs, const float* sn, bool inverse, T* out) {
  const int64_t B = x.size(0), S = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  const int64_t s0 = x.stride(0), s1 = x.stride(1), s2 = x.stride(2), s3 = x.stride(3);
  const T* base = static_cast<const T*>(x.data_ptr());
  const float sign = inverse ? -1.0f : 1.0f;
  const int64_t rows = B * S * H;
  cpu::parallel_for(rows, std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(D, 1)),
                    [&](int64_t rb, int64_t re) {
                      for (int64_t r = rb; r < re; ++r) {
                        const int64_t h = r % H, t = (r / H) % S, b = r / (H * S);
                        const T* xr = base + b * s0 + t * s1 + h * s2;
                        const float* c = cs + t * half;
                        const float* s = sn + t * half;
                        T* o = out + r * D;
                        if (s3 == 1) {
                          for (int64_t i = 0; i < half; ++i) {
                            float x1 = static_cast<float>(xr[i]),
                                  x2 = static_cast<float>(xr[i + half]);
                            float si = sign * s[i];
                            o[i] = static_cast<T>(x1 * c[i] - x2 * si);
                            o[i + half] = static_cast<T>(x2 * c[i] + x1 * si);
                          }
                        } else {
                          for (int64_t i = 0; i < half; ++i) {
                            float x1 = static_cast<float>(xr[i * s3]),
                                  x2 = static_cast<float>(xr[(i + half) * s3]);
                            float si = sign * s[i];
                            o[i] = static_cast<T>(x1 * c[i] - x2 * si);
                            o[i + half] = static_cast<T>(x2 * c[i] + x1 * si);
                          }
                        }
                      }
                    });
}

}  // namespace

std::pair<Tensor, Tensor> rope_cache(int64_t seq_len, int64_t head_dim, double base,
                                     int64_t start_pos) {
  TD_CHECK(seq_len >= 0, "rope_cache: seq_len must be >= 0, got ", seq_len);
  TD_CHECK(head_dim > 0 && head_dim % 2 == 0,
           "rope_cache: head_dim must be positive and even, got ", head_dim);
  TD_CHECK(base > 0, "rope_cache: base must be positive, got ", base);
  TD_CHECK(start_pos >= 0, "rope_cache: start_pos must be >= 0, got ", start_pos);
  const int64_t half = head_dim / 2;
  Tensor c = Tensor::empty({seq_len, half}, DType::Float32, kCPU);
  Tensor s = Tensor::empty({seq_len, half}, DType::Float32, kCPU);
  float* cp = c.data_ptr<float>();
  float* sp = s.data_ptr<float>();
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  }
  // Angles in double: t * freq reaches ~1e5 radians for long contexts, where fp32 loses digits.
  for (int64_t t = 0; t < seq_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      double a = static_cast<double>(start_pos + t) * inv_freq[i];
      cp[t * half + i] = static_cast<float>(std::cos(a));
      sp[t * half + i] = static_cast<float>(std::sin(a));
    }
  }
  return {c, s};
}

Tensor rotary_kernel(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  const char* op = "apply_rotary";
  check_rotary_args(op, x, cos, sin);
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::rotary(x, cos, sin, inverse);
#endif
  for (const Tensor* t : {&x, &cos, &sin}) ops::check_cpu(*t, op);
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  Tensor cc = cos.detach().contiguous(), sc = sin.detach().contiguous();
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    rotary_rows<T>(x, cc.data_ptr<float>(), sc.data_ptr<float>(), inverse,
                   static_cast<T*>(out.data_ptr()));
  });
  return out;
}

Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  Tensor out = rotary_kernel(x, cos, sin, false);
  if (needs_grad({x})) {
    record("RotaryBackward", {x}, {&out},
           [cos = cos.detach(), sin = sin.detach()](const TensorList& g, const auto&) {
             return TensorList{rotary_kernel(g[0], cos, sin, true)};
           });
  }
  return out;
}

}  // namespace td
