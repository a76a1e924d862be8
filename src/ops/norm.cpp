#include "tardelli/ops/norm.h"

#include <cmath>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"
#if TD_WITH_CUDA
#include "ops/cuda/norm.h"
#endif

// Note [Fused norms]: x is viewed as a contiguous [rows, N] matrix (N = numel of the normalized
// shape; a strided x is copied first). Forward: each row is loaded once into a float scratch
// row that stays in L1/L2, the statistics are two passes over it (mean, then the centred sum of
// squares: no cancellation, unlike E[x^2] - E[x]^2), and y is written in a third pass. The
// statistics are saved as fp32 [rows] whatever the dtype.
//
// Note [Corrected two-pass statistics]: the fp32 sum behind the first mean is off by a few ulps
// of the row's sum, which for rows with a large offset (mean 1000, spread 1) is 1e-4 of the
// spread: every xhat would carry that error. The centred pass therefore also sums the residuals
// d = x - mean (a sum of small numbers, nearly exact): their mean c is the first mean's error.
// The mean becomes mean + c and the centred sum of squares sum(d^2) - c * sum(d) (the exact
// identity for sum((d - c)^2)), at no extra pass. CPU and CUDA kernels both do this.
//
// Note [Deterministic weight gradients]: dweight/dbias sum over rows. Rows are cut into a
// number of chunks that depends only on `rows` (never on the thread count); each chunk sums its
// rows in order into its own fp32 partial, and the partials are added in chunk order (in
// double). The result is bitwise the same for any number of threads.

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

int64_t row_grain(int64_t n) {
  return std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(n, 1));
}

// Any-dtype floating tensor as a contiguous fp32 vector (weights: N values, read per row).
std::vector<float> as_floats(const Tensor& t) {
  if (!t.defined()) return {};
  return to_vector<float>(t);
}

template <typename T>
const float* load_row(const T* src, int64_t n, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    for (int64_t j = 0; j < n; ++j) scratch[j] = static_cast<float>(src[j]);
    return scratch;
  }
}

template <typename T>
void store_row(const float* src, int64_t n, T* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<T>(src[j]);
}

// Validates x, weight and bias against a trailing normalized_shape; returns its numel.
int64_t check_normalized_shape(const char* op, const Tensor& x, const Shape& ns, const Tensor& w,
                               const Tensor& b) {
  ops::check_defined(x, op, "input");
  ops::check_floating(x, op);
  TD_CHECK(!ns.empty(), op, ": normalized_shape must not be empty (input ", describe(x), ")");
  int64_t k = static_cast<int64_t>(ns.size());
  TD_CHECK(k <= x.dim(), op, ": normalized_shape ", shape_str(ns), " has more dims than input ",
           describe(x));
  Shape trailing(x.sizes().end() - k, x.sizes().end());
  TD_CHECK(trailing == ns, op, ": input ", describe(x), " does not end with normalized_shape ",
           shape_str(ns), " (expected input of shape [*, ", shape_str(ns).substr(1));
  for (const Tensor* p : {&w, &b}) {
    if (!p->defined()) continue;
    const char* name = p == &w ? "weight" : "bias";
    ops::check_same_device(x, *p, op);
    TD_CHECK(p->is_floating_point(), op, ": ", name, " must be floating point, got ", describe(*p));
    TD_CHECK(p->sizes() == ns, op, ": ", name, " ", describe(*p), " must have normalized_shape ",
             shape_str(ns));
  }
  return numel_of(ns);
}

// Checks the [rows, N] layout of a tensor against x for the fused entry points (any device).
void check_rows(const char* op, const Tensor& x, int64_t n) {
  ops::check_defined(x, op, "input");
  ops::check_floating(x, op);
  TD_CHECK(n > 0 && x.numel() % n == 0, op, ": norm_numel ", n, " does not divide input ",
           describe(x));
}

void check_stat(const char* op, const char* name, const Tensor& s, int64_t rows) {
  ops::check_defined(s, op, name);
  TD_CHECK(s.dtype() == DType::Float32 && s.numel() == rows, op, ": ", name,
           " must be float32 with one value per row (", rows, "), got ", describe(s));
}

template <typename T, bool kLayer>
void norm_forward_kernel(const T* x, T* y, float* mean_out, float* rstd_out, int64_t rows,
                         int64_t n, const float* w, const float* b, float eps) {
  cpu::parallel_for(rows, row_grain(n), [&](int64_t rb, int64_t re) {
    constexpr bool kFloat = std::is_same_v<T, float>;
    std::vector<float> xs(kFloat ? 0 : n), ys(kFloat ? 0 : n);
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int64_t r = rb; r < re; ++r) {
      const float* xr = load_row(x + r * n, n, xs.data());
      float* yr = kFloat ? reinterpret_cast<float*>(y + r * n) : ys.data();
      float mu = 0.0f;
      if constexpr (kLayer) {
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; ++j) s += xr[j];
        mu = s * inv_n;
      }
      float ss = 0.0f, sd = 0.0f;
#pragma omp simd reduction(+ : ss, sd)
      for (int64_t j = 0; j < n; ++j) {
        const float d = xr[j] - mu;
        sd += d;
        ss += d * d;
      }
      if constexpr (kLayer) {  // Note [Corrected two-pass statistics]
        const float c = sd * inv_n;
        mu += c;
        ss = std::max(0.0f, ss - c * sd);
      }
      float rstd = 1.0f / std::sqrt(ss * inv_n + eps);
      if (w && b) {
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rstd * w[j] + b[j];
      } else if (w) {
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rstd * w[j];
      } else if (b) {
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rstd + b[j];
      } else {
        for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rstd;
      }
      if constexpr (!kFloat) store_row(yr, n, y + r * n);
      if (mean_out) mean_out[r] = mu;
      rstd_out[r] = rstd;
    }
  });
}

// Rows per chunk of the weight-gradient reduction (Note [Deterministic weight gradients]):
// enough chunks to balance threads, few enough that the partials stay small.
int64_t chunk_rows(int64_t rows) {
  constexpr int64_t kMaxChunks = 64;
  return std::max<int64_t>(1, (rows + kMaxChunks - 1) / kMaxChunks);
}

// dx (and, if requested, dweight/dbias as fp32 sums). xhat = (x - mean) * rstd, gw = g * w:
//   layer: dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
//   rms:   dx = rstd * (gw - xhat * mean(gw * xhat))
template <typename T, bool kLayer>
void norm_backward_kernel(const T* g, const T* x, const float* mean, const float* rstd, T* dx,
                          int64_t rows, int64_t n, const float* w, std::vector<double>* dw,
                          std::vector<double>* db) {
  const int64_t cr = chunk_rows(rows);
  const int64_t nchunks = (rows + cr - 1) / cr;
  const bool want_dw = dw != nullptr, want_db = db != nullptr;
  std::vector<float> pw(want_dw ? nchunks * n : 0), pb(want_db ? nchunks * n : 0);
  cpu::parallel_for(nchunks, 1, [&](int64_t cb, int64_t ce) {
    constexpr bool kFloat = std::is_same_v<T, float>;
    std::vector<float> gs(kFloat ? 0 : n), xs(kFloat ? 0 : n), xh(n), gw(n), os(kFloat ? 0 : n);
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int64_t c = cb; c < ce; ++c) {
      float* pwc = want_dw ? pw.data() + c * n : nullptr;
      float* pbc = want_db ? pb.data() + c * n : nullptr;
      for (int64_t r = c * cr; r < std::min(rows, (c + 1) * cr); ++r) {
        const float* gr = load_row(g + r * n, n, gs.data());
        const float* xr = load_row(x + r * n, n, xs.data());
        float* o = kFloat ? reinterpret_cast<float*>(dx + r * n) : os.data();
        const float mu = kLayer ? mean[r] : 0.0f, rs = rstd[r];
        float* xhr = xh.data();
        float* gwr = gw.data();
        for (int64_t j = 0; j < n; ++j) xhr[j] = (xr[j] - mu) * rs;
        if (w) {
          for (int64_t j = 0; j < n; ++j) gwr[j] = gr[j] * w[j];
        } else {
          for (int64_t j = 0; j < n; ++j) gwr[j] = gr[j];
        }
        float s_gw = 0.0f, s_gwx = 0.0f;
#pragma omp simd reduction(+ : s_gw, s_gwx)
        for (int64_t j = 0; j < n; ++j) {
          s_gw += gwr[j];
          s_gwx += gwr[j] * xhr[j];
        }
        const float a = kLayer ? s_gw * inv_n : 0.0f, bcoef = s_gwx * inv_n;
        for (int64_t j = 0; j < n; ++j) o[j] = rs * (gwr[j] - a - xhr[j] * bcoef);
        if constexpr (!kFloat) store_row(o, n, dx + r * n);
        if (pwc) {
          for (int64_t j = 0; j < n; ++j) pwc[j] += gr[j] * xhr[j];
        }
        if (pbc) {
          for (int64_t j = 0; j < n; ++j) pbc[j] += gr[j];
        }
      }
    }
  });
  // Combine the chunk partials in chunk order, columns in parallel.
  auto combine = [&](const std::vector<float>& part) {
    std::vector<double> out(n, 0.0);
    cpu::parallel_for(n, 4096, [&](int64_t jb, int64_t je) {
      for (int64_t c = 0; c < nchunks; ++c) {
        const float* pc = part.data() + c * n;
        for (int64_t j = jb; j < je; ++j) out[j] += pc[j];
      }
    });
    return out;
  };
  if (dw) *dw = combine(pw);
  if (db) *db = combine(pb);
}

// fp64 sums rounded once into a new tensor of the given shape and floating dtype.
Tensor vector_to_tensor(const std::vector<double>& v, const Shape& sizes, DType dtype) {
  Tensor t = Tensor::empty(sizes, dtype, kCPU);
  TD_DISPATCH_FLOATING(dtype, "norm_backward", [&]<typename T>() {
    T* p = static_cast<T*>(t.data_ptr());
    for (size_t j = 0; j < v.size(); ++j) p[j] = static_cast<T>(static_cast<float>(v[j]));
  });
  return t;
}

}  // namespace

// ---- layer_norm ----

NormForward layer_norm_forward(const Tensor& x, int64_t norm_numel, const Tensor& weight,
                               const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  check_rows(op, x, norm_numel);
  for (const Tensor* p : {&weight, &bias}) {
    TD_CHECK(!p->defined() || p->numel() == norm_numel, op, ": weight/bias ", describe(*p),
             " must have ", norm_numel, " elements");
  }
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::layer_norm_forward(x, norm_numel, weight, bias, eps);
#endif
  ops::check_cpu(x, op);
  Tensor xc = x.detach().contiguous();
  int64_t rows = x.numel() / norm_numel;
  NormForward f;
  f.y = Tensor::empty(x.sizes(), x.dtype(), x.device());
  f.mean = Tensor::empty({rows}, DType::Float32, x.device());
  f.rstd = Tensor::empty({rows}, DType::Float32, x.device());
  std::vector<float> w = as_floats(weight), b = as_floats(bias);
  if (rows == 0) return f;
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    norm_forward_kernel<T, true>(
        static_cast<const T*>(xc.data_ptr()), static_cast<T*>(f.y.data_ptr()),
        f.mean.data_ptr<float>(), f.rstd.data_ptr<float>(), rows, norm_numel,
        w.empty() ? nullptr : w.data(), b.empty() ? nullptr : b.data(), static_cast<float>(eps));
  });
  return f;
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x,
                                                       const Tensor& mean, const Tensor& rstd,
                                                       const Tensor& weight, bool has_bias,
                                                       int64_t norm_numel) {
  const char* op = "layer_norm_backward";
  check_rows(op, x, norm_numel);
  ops::check_defined(grad, op, "grad");
  TD_CHECK(grad.sizes() == x.sizes(), op, ": grad ", describe(grad), " must match input ",
           describe(x));
  int64_t rows = x.numel() / norm_numel;
  check_stat(op, "mean", mean, rows);
  check_stat(op, "rstd", rstd, rows);
  Tensor xc = x.detach().contiguous();
  Tensor gc =
      (grad.dtype() == x.dtype() ? grad.detach() : to_dtype(grad.detach(), x.dtype())).contiguous();
#if TD_WITH_CUDA
  if (x.is_cuda()) {
    return cuda_ops::layer_norm_backward(gc, xc, mean, rstd, weight, has_bias, norm_numel);
  }
#endif
  ops::check_cpu(x, op);
  ops::check_cpu(grad, op);
  Tensor mc = mean.detach().contiguous(), rc = rstd.detach().contiguous();
  Tensor dx = Tensor::empty(x.sizes(), x.dtype(), x.device());
  std::vector<float> w = as_floats(weight);
  std::vector<double> dw, db;
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    norm_backward_kernel<T, true>(static_cast<const T*>(gc.data_ptr()),
                                  static_cast<const T*>(xc.data_ptr()), mc.data_ptr<float>(),
                                  rc.data_ptr<float>(), static_cast<T*>(dx.data_ptr()), rows,
                                  norm_numel, w.empty() ? nullptr : w.data(),
                                  weight.defined() ? &dw : nullptr, has_bias ? &db : nullptr);
  });
  Tensor dweight =
      weight.defined() ? vector_to_tensor(dw, weight.sizes(), weight.dtype()) : Tensor();
  // dbias has the weight's shape and dtype when there is a weight, else [N] in x's dtype.
  Tensor dbias;
  if (has_bias) {
    dbias = weight.defined() ? vector_to_tensor(db, weight.sizes(), weight.dtype())
                             : vector_to_tensor(db, {norm_numel}, x.dtype());
  }
  return {dx, dweight, dbias};
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  int64_t n = check_normalized_shape("layer_norm", x, normalized_shape, weight, bias);
  NormForward f = layer_norm_forward(x, n, weight, bias, eps);
  Tensor out = f.y;
  if (needs_grad({x, weight, bias})) {
    record(
        "LayerNormBackward", {x, weight, bias}, {&out},
        [x, weight, bias, mean = f.mean, rstd = f.rstd, n](const TensorList& g, const auto& need) {
          auto [dx, dw, db] = layer_norm_backward(g[0], x, mean, rstd, weight, bias.defined(), n);
          if (db.defined()) db = db.to(bias.dtype()).view(bias.sizes());
          return TensorList{need[0] ? dx : Tensor(), need[1] ? dw : Tensor(),
                            need[2] ? db : Tensor()};
        });
  }
  return out;
}

// ---- rms_norm ----

NormForward rms_norm_forward(const Tensor& x, int64_t norm_numel, const Tensor& weight,
                             double eps) {
  const char* op = "rms_norm";
  check_rows(op, x, norm_numel);
  TD_CHECK(!weight.defined() || weight.numel() == norm_numel, op, ": weight ", describe(weight),
           " must have ", norm_numel, " elements");
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::rms_norm_forward(x, norm_numel, weight, eps);
#endif
  ops::check_cpu(x, op);
  Tensor xc = x.detach().contiguous();
  int64_t rows = x.numel() / norm_numel;
  NormForward f;
  f.y = Tensor::empty(x.sizes(), x.dtype(), x.device());
  f.rstd = Tensor::empty({rows}, DType::Float32, x.device());
  std::vector<float> w = as_floats(weight);
  if (rows == 0) return f;
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    norm_forward_kernel<T, false>(static_cast<const T*>(xc.data_ptr()),
                                  static_cast<T*>(f.y.data_ptr()), nullptr,
                                  f.rstd.data_ptr<float>(), rows, norm_numel,
                                  w.empty() ? nullptr : w.data(), nullptr, static_cast<float>(eps));
  });
  return f;
}

std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                                            const Tensor& weight, int64_t norm_numel) {
  const char* op = "rms_norm_backward";
  check_rows(op, x, norm_numel);
  ops::check_defined(grad, op, "grad");
  TD_CHECK(grad.sizes() == x.sizes(), op, ": grad ", describe(grad), " must match input ",
           describe(x));
  int64_t rows = x.numel() / norm_numel;
  check_stat(op, "rstd", rstd, rows);
  Tensor xc = x.detach().contiguous();
  Tensor gc =
      (grad.dtype() == x.dtype() ? grad.detach() : to_dtype(grad.detach(), x.dtype())).contiguous();
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::rms_norm_backward(gc, xc, rstd, weight, norm_numel);
#endif
  ops::check_cpu(x, op);
  ops::check_cpu(grad, op);
  Tensor rc = rstd.detach().contiguous();
  Tensor dx = Tensor::empty(x.sizes(), x.dtype(), x.device());
  std::vector<float> w = as_floats(weight);
  std::vector<double> dw;
  TD_DISPATCH_FLOATING(x.dtype(), op, [&]<typename T>() {
    norm_backward_kernel<T, false>(
        static_cast<const T*>(gc.data_ptr()), static_cast<const T*>(xc.data_ptr()), nullptr,
        rc.data_ptr<float>(), static_cast<T*>(dx.data_ptr()), rows, norm_numel,
        w.empty() ? nullptr : w.data(), weight.defined() ? &dw : nullptr, nullptr);
  });
  return {dx, weight.defined() ? vector_to_tensor(dw, weight.sizes(), weight.dtype()) : Tensor()};
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  int64_t n = check_normalized_shape("rms_norm", x, normalized_shape, weight, Tensor());
  NormForward f = rms_norm_forward(x, n, weight, eps);
  Tensor out = f.y;
  if (needs_grad({x, weight})) {
    record("RmsNormBackward", {x, weight}, {&out},
           [x, weight, rstd = f.rstd, n](const TensorList& g, const auto& need) {
             auto [dx, dw] = rms_norm_backward(g[0], x, rstd, weight, n);
             return TensorList{need[0] ? dx : Tensor(), need[1] ? dw : Tensor()};
           });
  }
  return out;
}

}  // namespace td
