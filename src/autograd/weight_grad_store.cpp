#include "tardelli/autograd/weight_grad_store.h"

#include "tardelli/autograd/engine.h"

namespace td::autograd {

namespace {
// The batch being filled by backward_input on this thread (the engine runs nodes on the
// calling thread), or null.
thread_local DeferredWeightGrads* t_batch = nullptr;
}  // namespace

void DeferredWeightGrads::run() {
  std::vector<std::function<void()>> fns = std::move(fns_);
  fns_.clear();
  for (auto& f : fns) f();
}

DeferredWeightGrads backward_input(const TensorList& roots, const TensorList& grad_roots) {
  TD_CHECK(t_batch == nullptr, "backward_input: already deferring weight gradients on this thread");
  DeferredWeightGrads batch;
  t_batch = &batch;
  try {
    // retain_graph: a deferred closure may later backpropagate through a node this pass also
    // ran (a cast weight feeding a deferred GEMM and another op). The graph is still freed when
    // the caller drops the roots; the closures keep only the nodes on their own paths.
    backward(roots, grad_roots, /*retain_graph=*/true);
  } catch (...) {
    t_batch = nullptr;
    throw;
  }
  t_batch = nullptr;
  return batch;
}

bool deferring_weight_grads() {
  return t_batch != nullptr;
}

void defer_weight_grad(const Tensor& weight, std::function<Tensor()> compute) {
  TD_CHECK(t_batch != nullptr, "defer_weight_grad: called outside backward_input");
  t_batch->push([weight, compute = std::move(compute)]() {
    Tensor gw = compute();
    // retain_graph: another deferred GEMM may share this weight's cast node.
    backward({weight}, {gw}, /*retain_graph=*/true);
  });
}

}  // namespace td::autograd
