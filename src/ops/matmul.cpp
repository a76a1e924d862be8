#include "tardelli/ops/matmul.h"

#include <atomic>

#include "ops/common.h"
#include "ops/cpu/onednn.h"
#include "ops/matmul_impl.h"
#include "tardelli/autograd/function.h"
#include "tardelli/autograd/weight_grad_store.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/view.h"

#if TD_WITH_CUDA
#include "ops/cuda/matmul.h"
#endif

// Note [Matmul layouts]: every product here reaches oneDNN as strided memory descriptors over
// the operands' own storage. A transposed view (W^T in linear, b^T in the backward) is a
// column-major matrix to oneDNN, not a copy; a batch dim of size 1 or stride 0 is oneDNN's
// implicit broadcast. Copies happen only where oneDNN has no fast kernel for the layout (see
// Note [Reference matmul] in cpu/onednn.cpp) or for the dtype (bf16/f16 on CPUs without
// AVX-512, where oneDNN 2.6 has no matmul: the operands are widened to fp32, multiplied with
// fp32 accumulation and the result rounded once). CUDA tensors take the same path down to run(),
// which hands them to cuBLASLt the same way: transposes and leading dims, not copies (see
// src/ops/cuda/matmul.cpp).

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

// Note [TF32 matmul]: off by default (as in torch): fp32 products on CUDA are then exact fp32
// FMAs. On, cuBLASLt may round fp32 operands to TF32 (10-bit mantissa) for tensor cores.
std::atomic<bool> g_allow_tf32{false};

// t on a device this build multiplies on (every CUDA tensor in a CUDA build; see Note [CUDA
// dispatch] in ops/cuda/launch.h).
void check_backend(const Tensor& t, const char* op) {
#if TD_WITH_CUDA
  if (t.is_cuda()) return;
#endif
  ops::check_cpu(t, op);
}

void check_operands(const Tensor& a, const Tensor& b, const char* op) {
  ops::check_defined(a, op, "input");
  ops::check_defined(b, op, "other");
  ops::check_same_device(a, b, op);
  check_backend(a, op);
  ops::check_floating(a, op);
  ops::check_floating(b, op);
  TD_CHECK(a.dtype() == b.dtype(), op, ": expected both operands to have the same dtype, got ",
           describe(a), " and ", describe(b), " (convert one with .to())");
}

// A copy with a dense layout, not recorded by autograd.
Tensor dense(const Tensor& t, DType dt) {
  Tensor c = Tensor::empty(t.sizes(), dt, t.device());
  copy_into(c, t);
  return c;
}

// Swaps the last two dims (a raw view: no autograd).
Tensor swap_inner(const Tensor& t) {
  Shape sz = t.sizes(), st = t.strides();
  std::swap(sz[sz.size() - 1], sz[sz.size() - 2]);
  std::swap(st[st.size() - 1], st[st.size() - 2]);
  return as_strided(t, sz, st, t.storage_offset());
}

// fp32 copy of t that keeps a transposed inner matrix transposed, so oneDNN still sees a unit
// stride after widening.
Tensor widen(const Tensor& t) {
  if (t.dim() >= 2 && !t.is_contiguous() && swap_inner(t).is_contiguous()) {
    return swap_inner(dense(swap_inner(t), DType::Float32));
  }
  return dense(t, DType::Float32);
}

// Runs out = a @ b (+ bias) with a, b, out already of one ndim; widens reduced floats to fp32
// when oneDNN has no kernel for them on this CPU.
void run(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out) {
  ops::matmul_out(a, b, bias, out);
}

// t viewed with extra leading size-1 dims to reach nd dims.
Tensor with_leading_ones(const Tensor& t, int64_t nd) {
  if (t.dim() == nd) return t;
  Shape sz(nd - t.dim(), 1), st(nd - t.dim(), 0);
  sz.insert(sz.end(), t.sizes().begin(), t.sizes().end());
  st.insert(st.end(), t.strides().begin(), t.strides().end());
  return as_strided(t, sz, st, t.storage_offset());
}

// t [..., R, C] viewed as [prod(...) * R, C] when its leading dims and R are one strided run.
std::optional<Tensor> as_rows(const Tensor& t) {
  const int64_t nd = t.dim();
  const int64_t C = t.size(nd - 1);
  if (nd == 1) return as_strided(t, {1, C}, {C * t.stride(0), t.stride(0)}, t.storage_offset());
  int64_t rows = 1, row_stride = 0;
  bool have = false;
  for (int64_t d = nd - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (!have) {
      row_stride = t.stride(d);
      have = true;
    } else if (t.stride(d) != rows * row_stride) {
      return std::nullopt;
    }
    rows *= t.size(d);
  }
  if (!have) row_stride = C * t.stride(nd - 1);
  if (rows == 0) row_stride = std::max<int64_t>(C, 1);
  return as_strided(t, {rows, C}, {row_stride, t.stride(nd - 1)}, t.storage_offset());
}

// out = a @ b for a [..., M, K], b [..., K, N] (both >= 2-D, one floating dtype, batch dims
// broadcast). Not recorded by autograd.
Tensor matmul_forward(const Tensor& a, const Tensor& b, const char* op) {
  const int64_t na = a.dim(), nb = b.dim();
  const int64_t M = a.size(na - 2), K = a.size(na - 1), N = b.size(nb - 1);
  TD_CHECK(b.size(nb - 2) == K, op, ": shapes ", shape_str(a.sizes()), " and ",
           shape_str(b.sizes()), " cannot be multiplied (", K, " columns vs ", b.size(nb - 2),
           " rows)");
  const int64_t nd = std::max(na, nb);
  Shape shape(nd);
  for (int64_t i = 0; i < nd - 2; ++i) {
    int64_t da = i - (nd - na), db = i - (nd - nb);
    int64_t sa = da >= 0 ? a.size(da) : 1, sb = db >= 0 ? b.size(db) : 1;
    TD_CHECK(sa == sb || sa == 1 || sb == 1, op, ": batch dims of ", shape_str(a.sizes()), " and ",
             shape_str(b.sizes()), " do not broadcast");
    shape[i] = sa == 1 ? sb : sa;
  }
  shape[nd - 2] = M;
  shape[nd - 1] = N;
  TD_CHECK(nd <= 12, op, ": at most 12 dims supported, got ", shape_str(a.sizes()), " and ",
           shape_str(b.sizes()));
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  // One weight matrix for the whole batch: fold the batch into rows (a single large GEMM).
  if (nb == 2 && na > 2) {
    if (auto rows = as_rows(a)) {
      Tensor o2 = as_strided(out, {rows->size(0), N}, {N, 1}, 0);
      run(*rows, b, Tensor(), o2);
      return out;
    }
  }
  run(with_leading_ones(a, nd), with_leading_ones(b, nd), Tensor(), out);
  return out;
}

// Differentiable product of two >= 2-D operands.
Tensor matmul_nd(const Tensor& a, const Tensor& b, const char* op) {
  Tensor out = matmul_forward(a.detach(), b.detach(), op);
  if (needs_grad({a, b})) {
    record("MatmulBackward", {a, b}, {&out}, [a, b](const TensorList& g, const auto& need) {
      const int64_t K = a.size(-1), N = b.size(-1);
      Tensor ga, gb;
      // grad_a = g @ b^T and grad_b = a^T @ g, summed over the batch dims each broadcast.
      if (need[0]) ga = sum_to(matmul(g[0], transpose(b, -2, -1)), a.sizes());
      if (need[1]) {
        if (b.dim() == 2 && a.dim() > 2) {
          // Shared weight: one [K, rows] @ [rows, N] GEMM instead of a batch then a sum.
          gb = mm(transpose(reshape(a, {-1, K}), 0, 1), reshape(g[0], {-1, N}));
        } else {
          gb = sum_to(matmul(transpose(a, -2, -1), g[0]), b.sizes());
        }
      }
      return TensorList{ga, gb};
    });
  }
  return out;
}

}  // namespace

void ops::matmul_out(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out) {
#if TD_WITH_CUDA
  if (out.is_cuda()) {
    cuda_ops::matmul_out(a, b, bias, out, "matmul");
    return;
  }
#endif
  if (cpu::onednn_has_matmul(out.dtype())) {
    cpu::onednn_matmul(a, b, bias, out);
    return;
  }
  Tensor out32 = Tensor::empty(out.sizes(), DType::Float32, out.device());
  cpu::onednn_matmul(widen(a), widen(b), bias.defined() ? dense(bias, DType::Float32) : Tensor(),
                     out32);
  copy_into(out, out32);
}

std::string cpu_matmul_kernel(DType dtype) {
  TD_CHECK(is_floating(dtype), "cpu_matmul_kernel: matrix products take floating dtypes, got ",
           dtype_name(dtype));
  if (cpu::onednn_has_matmul(dtype)) return cpu::onednn_matmul_impl(dtype);
  const std::string impl = cpu::onednn_matmul_impl(dtype);
  return "fp32 widening (oneDNN: " + (impl.empty() ? std::string("no kernel") : impl) + ")";
}

std::string cpu_isa() {
  return cpu::onednn_cpu_isa();
}

void set_matmul_allow_tf32(bool allow) {
  g_allow_tf32.store(allow, std::memory_order_relaxed);
}
bool matmul_allow_tf32() {
  return g_allow_tf32.load(std::memory_order_relaxed);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_operands(a, b, "matmul");
  TD_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dim, got ",
           describe(a), " and ", describe(b));
  const int64_t kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  TD_CHECK(a.size(-1) == kb, "matmul: shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()),
           " cannot be multiplied (", a.size(-1), " vs ", kb, ")");
  if (a.dim() == 1 && b.dim() == 1) {
    return reshape(matmul_nd(unsqueeze(a, 0), unsqueeze(b, 1), "matmul"), {});
  }
  if (a.dim() == 1) return squeeze(matmul_nd(unsqueeze(a, 0), b, "matmul"), -2);
  if (b.dim() == 1) return squeeze(matmul_nd(a, unsqueeze(b, 1), "matmul"), -1);
  return matmul_nd(a, b, "matmul");
}

Tensor mm(const Tensor& a, const Tensor& b) {
  check_operands(a, b, "mm");
  TD_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got ", describe(a), " and ",
           describe(b));
  return matmul_nd(a, b, "mm");
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_operands(a, b, "bmm");
  TD_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D tensors, got ", describe(a), " and ",
           describe(b));
  TD_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: ", shape_str(a.sizes()), " and ",
           shape_str(b.sizes()));
  return matmul_nd(a, b, "bmm");
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const char* op = "linear";
  check_operands(x, weight, op);
  TD_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out, in], got ", describe(weight));
  TD_CHECK(x.dim() >= 1, "linear: input must have at least 1 dim, got ", describe(x));
  const int64_t in = weight.size(1), outf = weight.size(0);
  TD_CHECK(x.size(-1) == in, "linear: input ", shape_str(x.sizes()), " has ", x.size(-1),
           " features but weight ", shape_str(weight.sizes()), " expects ", in);
  if (bias.defined()) {
    ops::check_same_device(x, bias, op);
    TD_CHECK(bias.dtype() == x.dtype(), "linear: bias dtype must match the input, got ",
             describe(bias), " and ", describe(x));
    TD_CHECK(bias.dim() == 1 && bias.size(0) == outf, "linear: bias ", shape_str(bias.sizes()),
             " does not match weight ", shape_str(weight.sizes()), " (expected [", outf, "])");
  }
  Shape shape = x.sizes();
  shape.back() = outf;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const int64_t rows = numel_of(Shape(x.sizes().begin(), x.sizes().end() - 1));
  if (out.numel() > 0) {
    Tensor xd = x.detach(), wd = weight.detach();
    std::optional<Tensor> x2 = as_rows(xd);
    Tensor xr = x2 ? *x2 : as_strided(dense(xd, xd.dtype()), {rows, in}, {in, 1}, 0);
    // W^T as strides: [in, out] with strides (W.stride(1), W.stride(0)).
    Tensor wt = as_strided(wd, {in, outf}, {wd.stride(1), wd.stride(0)}, wd.storage_offset());
    Tensor bd;
    if (bias.defined()) bd = bias.is_contiguous() ? bias.detach() : dense(bias, bias.dtype());
    run(xr, wt, bd, as_strided(out, {rows, outf}, {outf, 1}, 0));
  }
  if (needs_grad({x, weight, bias})) {
    record("LinearBackward", {x, weight, bias}, {&out},
           [x, weight, rows, has_bias = bias.defined()](const TensorList& g, const auto& need) {
             const int64_t in = weight.size(1), outf = weight.size(0);
             Tensor g2 = reshape(g[0], {rows, outf});
             Tensor gx, gw, gb;
             if (need[0]) gx = reshape(mm(g2, weight), x.sizes());
             if (need[1] && autograd::deferring_weight_grads()) {
               // Note [Deferred weight gradients]: keep (dY, X) for dW, computed later.
               autograd::defer_weight_grad(weight, [g2, x, rows, in] {
                 return mm(transpose(g2, 0, 1), reshape(x, {rows, in}));
               });
             } else if (need[1]) {
               gw = mm(transpose(g2, 0, 1), reshape(x, {rows, in}));
             }
             if (has_bias && need[2]) gb = sum(g2, {0});
             return TensorList{gx, gw, gb};
           });
  }
  return out;
}

}  // namespace td
