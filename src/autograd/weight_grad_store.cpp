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
    backward(roots, grad_roots, /*retain_graph=*/false);
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
    backward({weight}, {gw}, /*retain_graph=*/false);
  });
}

}  // namespace td::autograd
