#pragma once
// Deferred weight gradients, for zero-bubble pipeline schedules (ZB-H1: Qi et al., "Zero Bubble
// Pipeline Parallelism", 2023).
//
// Note [Deferred weight gradients]: a layer's backward has two parts: the input gradient
// (dX = dY W), which the previous pipeline stage is waiting for, and the weight gradient
// (dW = dY^T X), which nobody needs until the optimizer step. backward_input() runs a backward
// pass in which every linear layer computes only dX (and its cheap bias gradient) and leaves a
// closure holding (dY, X) for dW in the returned DeferredWeightGrads; run() later computes those
// GEMMs and accumulates them into the weights' .grad exactly as the full backward would have
// (through any differentiable cast between the leaf and the GEMM, with post-accumulate hooks,
// so data-parallel buckets launch as usual). Other ops (norms, embeddings) compute their weight
// gradients in the input pass: they are cheap next to the GEMMs.
#include <functional>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::autograd {

class DeferredWeightGrads {
 public:
  // Computes and accumulates every deferred weight gradient, in the order they were deferred;
  // afterwards the batch is empty (running it again does nothing).
  void run();
  size_t size() const { return fns_.size(); }
  bool empty() const { return fns_.empty(); }

  void push(std::function<void()> fn) { fns_.push_back(std::move(fn)); }

 private:
  std::vector<std::function<void()>> fns_;
};

// backward(roots, grad_roots) with the GEMM weight gradients deferred into the result. The pass
// retains the graph's saved tensors (a deferred closure may need a node the pass also ran, e.g.
// a cast weight shared with another op): they are freed when the caller drops the roots, except
// what the deferred closures hold (their GEMM operands and the paths to their weights).
DeferredWeightGrads backward_input(const TensorList& roots, const TensorList& grad_roots);

// For ops: whether weight gradients are being deferred on this thread, and how to defer one.
// `compute` returns dW; it is accumulated into `weight` (a leaf or a differentiable function
// of one) when the batch runs.
bool deferring_weight_grads();
void defer_weight_grad(const Tensor& weight, std::function<Tensor()> compute);

}  // namespace td::autograd
