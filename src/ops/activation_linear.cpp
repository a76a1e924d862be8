#include "tardelli/ops/activation_linear.h"

#include <tuple>

#include "ops/common.h"
#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/autograd/weight_grad_store.h"
#include "tardelli/ops/activation.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/join.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/view.h"

// Note [Recomputed MLP activation]: in a transformer MLP the activation's output act(h) is kept
// only because the second linear layer needs it for its weight gradient, while h itself is kept
// for the activation's own backward. Both are [tokens, ff] (GPT-2: 4 d per token, the largest
// per-layer activations after the attention's). Recomputing act(h) from h in backward costs one
// elementwise pass and drops act(h) from the saved set: with d = 256, ff = 1024 and 2048 tokens
// that is 8 MiB per layer of the fused GPT's step peak. Megatron's "selective recomputation"
// does the same for the attention core; this is the MLP's equivalent.

namespace td {

Tensor mlp_activation(const Tensor& h, MlpActivation act) {
  if (act == MlpActivation::GeluTanh) return gelu(h, GeluApprox::Tanh);
  TD_CHECK(h.dim() >= 1 && h.size(-1) % 2 == 0, "mlp_activation: SwiGLU needs [..., 2 ff] ",
           "([gate | up]), got ", describe(h));
  // One split, not two narrows: h's gradient is formed once, in one [t, 2 ff] buffer, where two
  // narrows' backwards would each fill their own with zeros and the engine would add the two
  // (Note [Split backward]; ActivationLinear.RecordedSwiGLUGradientFormedOnce).
  TensorList gate_up = chunk(h, 2, -1);
  return mul(silu(gate_up[0]), gate_up[1]);
}

std::pair<Tensor, Tensor> mlp_activation_and_backward(const Tensor& grad, const Tensor& h,
                                                      MlpActivation act) {
  if (act == MlpActivation::GeluTanh) return gelu_and_backward(grad, h, GeluApprox::Tanh);
  const int64_t in = h.size(-1) / 2;
  Tensor gate = h.narrow(-1, 0, in), up = h.narrow(-1, in, in);
  // Note [SwiGLU backward memory]: one [t, ff] buffer at a time. dm x up, silu_backward's
  // input, dies with its own statement instead of living to the end of the cat (as a temporary
  // of one big expression would), and the two halves go before act(h) is formed: at the cat
  // there are s, the two half gradients and the cat, five [t, ff] beside grad and h, not six.
  Tensor s = silu(gate);
  Tensor dgate = silu_backward(mul(grad, up), gate);
  Tensor dup = mul(grad, s);
  Tensor gh = cat({dgate, dup}, -1);
  dgate = Tensor();
  dup = Tensor();
  return {mul(s, up), gh};
}

namespace {

// act(h) for a detached h.
Tensor apply(const Tensor& h, MlpActivation act) {
  return mlp_activation(h, act);
}

}  // namespace

Tensor activation_linear(const Tensor& h, MlpActivation act, const Tensor& weight,
                         const Tensor& bias) {
  const char* op = "activation_linear";
  ops::check_defined(h, op, "input");
  ops::check_defined(weight, op, "weight");
  TD_CHECK(h.dim() >= 1 && weight.dim() == 2, op, ": expected input [..., k] and weight [out, in]",
           ", got ", describe(h), " and ", describe(weight));
  const int64_t in = weight.size(1);
  const int64_t want = act == MlpActivation::SwiGLU ? 2 * in : in;
  TD_CHECK(
      h.size(-1) == want, op, ": input ", describe(h), " must have ", want,
      act == MlpActivation::SwiGLU ? " features ([gate | up], twice the weight's " : " features (",
      in, " inputs of weight ", shape_str(weight.sizes()), ")");
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = linear(apply(h.detach(), act), weight.detach(), bias.defined() ? bias.detach() : bias);
  }
  if (!autograd::needs_grad({h, weight, bias})) return out;
  const int64_t rows = h.numel() / std::max<int64_t>(h.size(-1), 1);
  autograd::record(
      "ActivationLinearBackward", {h, weight, bias}, {&out},
      [h, weight, act, rows, has_bias = bias.defined()](const TensorList& g, const auto& need) {
        const int64_t in = weight.size(1), outf = weight.size(0);
        Tensor hd = h.detach();
        Tensor g2 = reshape(g[0], {rows, outf});
        Tensor gh, gw, gb;
        const bool deferred = need[1] && autograd::deferring_weight_grads();
        Tensor m;  // act(h), recomputed; for GELU together with the input gradient
        if (need[0]) {
          Shape ms = hd.sizes();
          ms.back() = in;
          Tensor dm = reshape(mm(g2, weight.detach()), ms);
          std::tie(m, gh) = mlp_activation_and_backward(dm, hd, act);
        }
        if (deferred) {
          // The deferred dW recomputes act(h) when it runs, so act(h) is not kept until then.
          autograd::defer_weight_grad(weight, [g2, hd, act, rows, in] {
            return mm(transpose(g2, 0, 1), reshape(apply(hd, act), {rows, in}));
          });
        } else if (need[1]) {
          if (!m.defined()) m = apply(hd, act);
          gw = mm(transpose(g2, 0, 1), reshape(m, {rows, in}));
        }
        if (has_bias && need[2]) gb = sum(g2, {0});
        return TensorList{gh, gw, gb};
      });
  return out;
}

}  // namespace td
