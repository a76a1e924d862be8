#include <cmath>

#include "ops/common.h"
#include "tardelli/autograd/engine.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"
#include "tardelli/ops/loss.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"

// Note [Chunked LM head]: in a small-vocabulary-heavy model the [tokens, V] logits and their
// gradient are the largest activations of a train step (GPT-2 at B*T = 2048, V = 8192: 64 MiB
// each in fp32). Rows are processed in chunks of at most chunk_elems logits, so neither is ever
// held whole. When a gradient will be needed the forward pass computes it too, chunk by chunk,
// while the chunk's logits exist (the "fused linear cross-entropy" of Liger and similar): the
// gradient of the summed loss with respect to the chunk's logits is softmax - onehot, so
// d x_chunk = dl @ W and d W += dl^T @ x_chunk are formed at once and the logits are dropped. The
// forward keeps only d x [N, d] and d W [V, d] (fp32) for backward, which scales them by
// grad / count. Against recomputing each chunk's logits in backward this saves one [N, d] x
// [d, V] GEMM (a sixth of the head's work) and the second softmax pass; the cost is that a
// forward under grad mode whose backward never runs has done the gradient work for nothing.
// The chunk loss is a Sum so that the mean over all non-ignored rows is exact whatever the
// chunking. On CUDA the same code runs on device tensors (the GEMMs and the fused cross-entropy
// kernels) and reads nothing back (Note [Head without read-backs]).

namespace td {

namespace {

int64_t count_valid(const Tensor& target, int64_t ignore_index) {
  return sum(ne(target, static_cast<double>(ignore_index))).item<int64_t>();
}

Tensor chunk_logits_fp32(const Tensor& x, const Tensor& w) {
  Tensor l = linear(x, w);
  return l.dtype() == DType::Float32 ? l : to_dtype(l, DType::Float32);
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& target,
                            int64_t ignore_index, int64_t chunk_elems) {
  const char* op = "linear_cross_entropy";
  ops::check_defined(x, op, "input");
  ops::check_defined(weight, op, "weight");
  ops::check_defined(target, op, "target");
  TD_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), op,
           ": expected input [N, d] and weight [V, d], got ", describe(x), " and ",
           describe(weight));
  TD_CHECK(target.dim() == 1 && target.size(0) == x.size(0) && is_integral(target.dtype()), op,
           ": expected an int target [", x.size(0), "], got ", describe(target));
  TD_CHECK(chunk_elems >= 0, op, ": chunk_elems must be positive (or 0: by device), got ",
           chunk_elems);
  // Note [LM head chunk size]: on the CPU 2^22 fp32 logits (16 MiB) keep a chunk near the
  // caches. On a GPU memory is plentiful and small chunks starve it: a V = 50304 head in 2^22
  // logits is 83-row chunks, whose thin GEMMs, fp32 conversions and per-chunk loss read-back took
  // 37 ms of a 68 ms GPT-2 (124M, B 8, T 1024, bf16) step on the H200. 2^27 logits (512 MiB)
  // make 2048-row chunks there.
  if (chunk_elems == 0) {
    chunk_elems = x.is_cuda() ? kLinearCrossEntropyChunkCuda : kLinearCrossEntropyChunkCpu;
  }
  ops::check_same_device(x, weight, op);
  ops::check_same_device(x, target, op);
  const int64_t N = x.size(0), V = weight.size(0);
  const int64_t rows = std::max<int64_t>(1, chunk_elems / std::max<int64_t>(V, 1));
  const bool grad = autograd::needs_grad({x, weight});
  const bool need_x = grad && x.requires_grad(), need_w = grad && weight.requires_grad();

  // Note [Head without read-backs]: on a GPU the count, the chunks' sums and the mean stay on
  // the device and the targets are checked by a deferred check, so the head reads nothing back
  // (it took one read per chunk, one for the count and one in backward); the CPU keeps its
  // double sums on the host (bitwise as before).
  const bool on_device = x.is_cuda();
  Tensor dx, dw32;  // d(sum of losses)/d x and / d weight (fp32), then divided by the count
  int64_t count = 0;
  double total = 0;
  Tensor count_dev, total_dev;  // on_device: fp32 0-dim tensors
  {
    autograd::NoGradGuard ng;
    if (on_device) {
      count_dev = to_dtype(sum(ne(target, static_cast<double>(ignore_index))), DType::Float32);
    } else {
      count = count_valid(target, ignore_index);
    }
    const Tensor xd = x.detach(), wd = weight.detach();
    if (need_x) dx = Tensor::empty(x.sizes(), x.dtype(), x.device());
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t n = std::min(rows, N - r0);
      Tensor xc = xd.narrow(0, r0, n), tc = target.narrow(0, r0, n);
      Tensor l = chunk_logits_fp32(xc, wd);
      if (!grad) {
        Tensor part = cross_entropy(l, tc, ignore_index, Reduction::Sum);
        if (on_device) {
          total_dev = total_dev.defined() ? add(total_dev, part) : part;
        } else {
          total += part.item_double();
        }
        continue;
      }
      // The chunk's logits become the gradient of its summed loss, in place.
      if (on_device) {
        Tensor part = cross_entropy_sum_and_grad_on_device_(l, tc, ignore_index);
        total_dev = total_dev.defined() ? add(total_dev, part) : part;
      } else {
        total += cross_entropy_sum_and_grad_(l, tc, ignore_index);
      }
      Tensor dl = x.dtype() == DType::Float32 ? l : to_dtype(l, x.dtype());
      if (need_x) copy_into(dx.narrow(0, r0, n), matmul(dl, wd));
      if (need_w) {
        Tensor part = matmul(dl.t(), xc);
        if (part.dtype() != DType::Float32) part = to_dtype(part, DType::Float32);
        if (dw32.defined()) {
          add_(dw32, part);
        } else {
          dw32 = part;
        }
      }
    }
    if (need_w && !dw32.defined()) dw32 = zeros(weight.sizes(), {DType::Float32, weight.device()});
  }
  // The mean's 1/count is applied in backward, with the incoming gradient, in the one pass that
  // forms the results (all rows ignored: zero gradient).
  const double inv = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
  Tensor out, inv_dev;
  if (on_device) {  // Note [Head without read-backs]
    autograd::NoGradGuard ng;
    if (!total_dev.defined()) total_dev = zeros({}, {DType::Float32, x.device()});
    out = div(total_dev, count_dev);  // all rows ignored: 0/0 = NaN, as cross_entropy's Mean
    inv_dev = where(gt(count_dev, 0.0), div(full({}, 1.0, {DType::Float32, x.device()}), count_dev),
                    zeros({}, {DType::Float32, x.device()}));
  } else {
    // All rows ignored: 0/0 = NaN, as cross_entropy's Mean.
    out = scalar_tensor(count > 0 ? total / static_cast<double>(count) : NAN, DType::Float32,
                        x.device());
  }
  if (grad) {
    autograd::record("LinearCrossEntropyBackward", {x, weight}, {&out},
                     [dx, dw32, inv, inv_dev, wdtype = weight.dtype()](
                         const TensorList& g, const std::vector<bool>& need) {
                       // New tensors, not the saved ones: with retain_graph a second backward
                       // must find them unchanged.
                       Tensor gx, gw;
                       if (inv_dev.defined()) {  // on the device, without a read-back
                         const Tensor s = mul(to_dtype(g[0], DType::Float32), inv_dev);
                         if (need[0] && dx.defined()) gx = to_dtype(mul(dx, s), dx.dtype());
                         if (need[1] && dw32.defined()) gw = to_dtype(mul(dw32, s), wdtype);
                         return TensorList{gx, gw};
                       }
                       const double s = g[0].item_double() * inv;
                       if (need[0] && dx.defined()) gx = mul(dx, s);
                       if (need[1] && dw32.defined()) gw = to_dtype(mul(dw32, s), wdtype);
                       return TensorList{gx, gw};
                     });
  }
  return out;
}

}  // namespace td
