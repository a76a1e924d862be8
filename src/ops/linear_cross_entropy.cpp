#include <cmath>

#include "ops/common.h"
#include "tardelli/autograd/engine.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/loss.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"

// Note [Chunked LM head]: in a small-vocabulary-heavy model the [tokens, V] logits and their
// gradient are the largest activations of a train step (GPT-2 at B*T = 2048, V = 8192: 64 MiB
// each in fp32). Chunking the rows bounds them by chunk_elems; the price is recomputing each
// chunk's logits in backward. The chunk loss is a Sum so that the mean over all non-ignored rows
// is exact whatever the chunking. On CUDA the same code runs on device tensors (the GEMMs and
// the fused cross-entropy kernels); only each chunk's summed loss comes back to the host.

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
  TD_CHECK(chunk_elems > 0, op, ": chunk_elems must be positive, got ", chunk_elems);
  ops::check_same_device(x, weight, op);
  ops::check_same_device(x, target, op);
  const int64_t N = x.size(0), V = weight.size(0);
  const int64_t rows = std::max<int64_t>(1, chunk_elems / std::max<int64_t>(V, 1));

  Tensor out;
  int64_t count = 0;
  {
    autograd::NoGradGuard ng;
    count = count_valid(target, ignore_index);
    double total = 0;
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      int64_t n = std::min(rows, N - r0);
      Tensor l = chunk_logits_fp32(x.narrow(0, r0, n), weight);
      total +=
          cross_entropy(l, target.narrow(0, r0, n), ignore_index, Reduction::Sum).item_double();
    }
    // All rows ignored: 0/0 = NaN, as cross_entropy's Mean.
    out = scalar_tensor(count > 0 ? total / static_cast<double>(count) : NAN, DType::Float32,
                        x.device());
  }
  if (autograd::needs_grad({x, weight})) {
    autograd::record(
        "LinearCrossEntropyBackward", {x, weight}, {&out},
        [x, weight, target, ignore_index, rows, count](const TensorList& g,
                                                       const std::vector<bool>& need) {
          const int64_t N = x.size(0);
          Tensor dx = need[0] ? empty_like(x) : Tensor();
          Tensor dw32 =
              need[1] ? zeros(weight.sizes(), {DType::Float32, weight.device()}) : Tensor();
          const double scale = count > 0 ? g[0].item_double() / static_cast<double>(count) : 0.0;
          autograd::NoGradGuard ng;
          for (int64_t r0 = 0; r0 < N; r0 += rows) {
            int64_t n = std::min(rows, N - r0);
            Tensor xc = x.narrow(0, r0, n).detach();
            Tensor l = chunk_logits_fp32(xc, weight.detach()).detach().set_requires_grad(true);
            Tensor dl;
            {
              autograd::GradModeGuard on(true);
              Tensor loss = cross_entropy(l, target.narrow(0, r0, n), ignore_index, Reduction::Sum);
              dl = autograd::grad({loss}, {l}, {})[0];
            }
            if (scale != 1.0) dl = mul(dl, scale);
            if (x.dtype() != DType::Float32) dl = to_dtype(dl, x.dtype());
            if (need[0]) copy_into(dx.narrow(0, r0, n), matmul(dl, weight.detach()));
            if (need[1]) {
              Tensor part = matmul(dl.t(), xc);
              add_(dw32, part.dtype() == DType::Float32 ? part : to_dtype(part, DType::Float32));
            }
          }
          Tensor dw;
          if (need[1])
            dw = weight.dtype() == DType::Float32 ? dw32 : to_dtype(dw32, weight.dtype());
          return TensorList{dx, dw};
        });
  }
  return out;
}

}  // namespace td
