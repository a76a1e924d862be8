#pragma once
// A linear layer whose input is an activation of the tensor it keeps: y = linear(act(h), W, b),
// with act(h) recomputed in backward instead of being saved (Note [Recomputed MLP activation]).
#include <utility>

#include "tardelli/core/tensor.h"

namespace td {

enum class MlpActivation {
  GeluTanh,  // gelu(h, tanh approximation): GPT-2's MLP
  SwiGLU,    // silu(gate) * up for h = [gate | up] along the last dim (2 * ff): LLaMA's MLP
};

// h [..., k] (k = in for GeluTanh, 2 * in for SwiGLU), weight [out, in], bias [out] or undefined
// -> [..., out]. Values and gradients equal linear(act(h), weight, bias) built from the separate
// ops; only h (not act(h)) is kept for backward. Under deferred weight gradients (Note [Deferred
// weight gradients]) the deferred dW recomputes act(h) itself.
// act(h) from the separate ops (gelu; silu(gate) * up), recorded op by op: what
// activation_linear recomputes, for callers that keep act(h) instead (GPT recompute none).
Tensor mlp_activation(const Tensor& h, MlpActivation act);
// {act(h), the gradient w.r.t. h} from h and `grad`, the gradient w.r.t. act(h) (GELU: one pass
// over both). Not recorded by autograd. The backward of activation_linear and grouped_linear.
std::pair<Tensor, Tensor> mlp_activation_and_backward(const Tensor& grad, const Tensor& h,
                                                      MlpActivation act);

Tensor activation_linear(const Tensor& h, MlpActivation act, const Tensor& weight,
                         const Tensor& bias = Tensor());

}  // namespace td
