#include "tardelli/autograd/node.h"

#include <atomic>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"

namespace td::autograd {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}

Node::Node(uint32_t num_inputs)
    : num_inputs_(num_inputs), sequence_nr_(g_next_sequence_nr.fetch_add(1)) {}

void Node::add_pre_hook(uint32_t output_nr, Tensor::Hook hook) {
  pre_hooks_.emplace_back(output_nr, std::move(hook));
}

void Node::run_pre_hooks(TensorList& grads) const {
  for (const auto& [nr, hook] : pre_hooks_) {
    if (nr < grads.size() && grads[nr].defined()) {
      if (auto r = hook(grads[nr])) grads[nr] = *r;
    }
  }
}

AutogradMeta& get_or_create_meta(const Tensor& t) {
  TD_CHECK(t.defined(), "autograd: undefined tensor");
  auto& m = t.impl()->autograd_meta;
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

AutogradMeta* meta_of(const Tensor& t) {
  return t.defined() ? t.impl()->autograd_meta.get() : nullptr;
}

AccumulateGrad::AccumulateGrad(Tensor leaf) : Node(1), leaf_(std::move(leaf)) {}

bool is_sole_buffer(const Tensor& g) {
  return g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous();
}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  AutogradMeta& m = get_or_create_meta(leaf_);
  for (const auto& hook : m.leaf_hooks) {
    if (auto r = hook(g)) g = *r;
  }
  TD_CHECK(g.sizes() == leaf_.sizes(), "AccumulateGrad: gradient of shape ", shape_str(g.sizes()),
           " for a leaf of shape ", shape_str(leaf_.sizes()));
  if (g.dtype() != leaf_.dtype()) g = to_dtype(g.detach(), leaf_.dtype());
  if (!m.grad.defined()) {
    // Steal the incoming buffer when nobody else can see it; otherwise copy, so that later
    // in-place accumulation never writes into a tensor shared with another leaf.
    m.grad = grad_enabled() ? g : (is_sole_buffer(g) ? g.detach() : clone(g.detach()));
  } else if (grad_enabled()) {
    m.grad = add(m.grad, g);  // create_graph: keep the accumulation differentiable
  } else {
    add_(m.grad, g);
  }
  for (const auto& hook : m.post_accumulate_hooks) hook(leaf_);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta_of(t);
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  auto acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

}  // namespace td::autograd
