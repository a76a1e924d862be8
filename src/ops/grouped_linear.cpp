#include "tardelli/ops/grouped_linear.h"

#include <tuple>

#include "ops/common.h"
#include "ops/matmul_impl.h"
#include "tardelli/autograd/function.h"
#include "tardelli/autograd/weight_grad_store.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/view.h"

// Note [Grouped GEMM]: the groups are row ranges of one [N, k] matrix (the tokens permuted by
// expert), so every product below reads and writes slices in place: group g's rows of x, of the
// output and of the gradients are narrow() views, its weight is weight.select(0, g), transposed
// by strides. The loop runs one GEMM per non-empty group; empty groups cost nothing (their
// weight and bias gradients are zeros). A fused grouped kernel (CUTLASS-style, one launch over
// all groups) needs exactly these operands and can replace the loops without an interface change.

namespace td {

namespace {

struct Groups {
  std::vector<int64_t> sizes, offsets;  // offsets[g]: the first row of group g
};

// out[group g] = a[group g] @ b_g (+ bias[g]) where b_g = trans ? weight[g]^T : weight[g]. out
// is a fresh contiguous [N, cols]; a is [N, rows of b_g]. Not recorded by autograd.
Tensor grouped_mm(const Tensor& a, const Tensor& weight, const Tensor& bias, const Groups& gr,
                  bool trans) {
  const int64_t N = a.size(0);
  const int64_t cols = trans ? weight.size(1) : weight.size(2);
  Tensor out = Tensor::empty({N, cols}, a.dtype(), a.device());
  for (size_t g = 0; g < gr.sizes.size(); ++g) {
    const int64_t n = gr.sizes[g];
    if (n == 0) continue;
    const auto gi = static_cast<int64_t>(g);
    Tensor w = weight.select(0, gi);
    ops::matmul_out(a.narrow(0, gr.offsets[g], n), trans ? w.transpose(0, 1) : w,
                    bias.defined() ? bias.select(0, gi) : Tensor(),
                    out.narrow(0, gr.offsets[g], n));
  }
  return out;
}

// dW[g] = dy[group g]^T @ a[group g] -> [G, out, in] (zeros for empty groups).
Tensor grouped_weight_grad(const Tensor& dy, const Tensor& a, const Groups& gr) {
  const auto G = static_cast<int64_t>(gr.sizes.size());
  Tensor gw = zeros({G, dy.size(1), a.size(1)}, {dy.dtype(), dy.device()});
  for (int64_t g = 0; g < G; ++g) {
    const int64_t n = gr.sizes[static_cast<size_t>(g)], off = gr.offsets[static_cast<size_t>(g)];
    if (n == 0) continue;
    ops::matmul_out(dy.narrow(0, off, n).transpose(0, 1), a.narrow(0, off, n), Tensor(),
                    gw.select(0, g));
  }
  return gw;
}

Tensor grouped_bias_grad(const Tensor& dy, const Groups& gr) {
  const auto G = static_cast<int64_t>(gr.sizes.size());
  Tensor gb = zeros({G, dy.size(1)}, {dy.dtype(), dy.device()});
  for (int64_t g = 0; g < G; ++g) {
    const int64_t n = gr.sizes[static_cast<size_t>(g)];
    if (n > 0)
      copy_into(gb.select(0, g), sum(dy.narrow(0, gr.offsets[static_cast<size_t>(g)], n), {0}));
  }
  return gb;
}

Groups check_args(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const std::vector<int64_t>& sizes, std::optional<MlpActivation> act) {
  const char* op = "grouped_linear";
  ops::check_defined(x, op, "input");
  ops::check_defined(weight, op, "weight");
  ops::check_same_device(x, weight, op);
#if TD_WITH_CUDA
  if (!x.is_cuda()) ops::check_cpu(x, op);
#else
  ops::check_cpu(x, op);
#endif
  ops::check_floating(x, op);
  ops::check_same_dtype(x, weight, op);
  TD_CHECK(x.dim() == 2, op, ": input must be 2-D [rows, features], got ", describe(x));
  TD_CHECK(weight.dim() == 3, op, ": weight must be 3-D [groups, out, in], got ", describe(weight));
  const int64_t G = weight.size(0), outf = weight.size(1), in = weight.size(2);
  TD_CHECK(static_cast<int64_t>(sizes.size()) == G, op, ": ", sizes.size(),
           " group sizes for a weight of ", G, " groups ", shape_str(weight.sizes()));
  const bool swiglu = act && *act == MlpActivation::SwiGLU;
  const int64_t want = swiglu ? 2 * in : in;
  TD_CHECK(x.size(1) == want, op, ": input ", shape_str(x.sizes()), " has ", x.size(1),
           " features but weight ", shape_str(weight.sizes()), " expects ", want,
           swiglu ? " ([gate | up], twice its inputs)" : "");
  if (bias.defined()) {
    ops::check_same_device(x, bias, op);
    ops::check_same_dtype(x, bias, op);
    TD_CHECK(bias.dim() == 2 && bias.size(0) == G && bias.size(1) == outf, op, ": bias ",
             shape_str(bias.sizes()), " does not match weight ", shape_str(weight.sizes()),
             " (expected [", G, ", ", outf, "])");
  }
  Groups gr;
  gr.sizes = sizes;
  int64_t total = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    TD_CHECK(sizes[g] >= 0, op, ": group ", g, " has negative size ", sizes[g]);
    gr.offsets.push_back(total);
    total += sizes[g];
  }
  TD_CHECK(total == x.size(0), op, ": the group sizes sum to ", total, " rows but the input has ",
           x.size(0));
  return gr;
}

}  // namespace

Tensor grouped_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const std::vector<int64_t>& group_sizes, std::optional<MlpActivation> act) {
  const Groups gr = check_args(x, weight, bias, group_sizes, act);
  const Tensor xd = x.detach().contiguous();
  const Tensor wd = weight.detach().contiguous();
  const Tensor bd = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = grouped_mm(act ? mlp_activation(xd, *act) : xd, wd, bd, gr, /*trans=*/true);
  }
  if (!autograd::needs_grad({x, weight, bias})) return out;
  autograd::record(
      "GroupedLinearBackward", {x, weight, bias}, {&out},
      [xd, wd, weight, gr, act, has_bias = bias.defined()](const TensorList& g, const auto& need) {
        const Tensor dy = g[0].contiguous();
        Tensor gx, gw, gb, a;  // a: the GEMM input, act(x) recomputed with the input gradient
        if (need[0]) {
          gx = grouped_mm(dy, wd, Tensor(), gr, /*trans=*/false);  // d a
          if (act) std::tie(a, gx) = mlp_activation_and_backward(gx, xd, *act);
        }
        if (need[1] && autograd::deferring_weight_grads()) {
          // Note [Deferred weight gradients]: act(x) is recomputed when the batch runs.
          autograd::defer_weight_grad(weight, [dy, xd, gr, act] {
            return grouped_weight_grad(dy, act ? mlp_activation(xd, *act) : xd, gr);
          });
        } else if (need[1]) {
          if (!a.defined()) a = act ? mlp_activation(xd, *act) : xd;
          gw = grouped_weight_grad(dy, a, gr);
        }
        if (has_bias && need[2]) gb = grouped_bias_grad(dy, gr);
        return TensorList{gx, gw, gb};
      });
  return out;
}

}  // namespace td
