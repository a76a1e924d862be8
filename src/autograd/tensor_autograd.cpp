// Tensor's autograd methods (declared in core/tensor.h, defined here so the core does not
// depend on autograd internals).
#include "tardelli/autograd/engine.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/autograd/node.h"
#include "tardelli/ops/elementwise.h"

namespace td {

using autograd::AutogradMeta;
using autograd::get_or_create_meta;
using autograd::meta_of;

bool Tensor::requires_grad() const {
  AutogradMeta* m = meta_of(*this);
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::set_requires_grad(bool r) {
  TD_CHECK(defined(), "requires_grad_: undefined tensor");
  if (r) {
    TD_CHECK(is_floating_point(), "requires_grad_: only tensors of floating point dtype can "
             "require gradients, got ", describe(*this));
  }
  AutogradMeta* m = meta_of(*this);
  if (m && m->grad_fn) {
    TD_CHECK(r, "requires_grad_(false) on a non-leaf tensor; use detach()");
    return *this;
  }
  get_or_create_meta(*this).requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const {
  AutogradMeta* m = meta_of(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    TD_CHECK(g.sizes() == sizes(), "set_grad: gradient shape ", shape_str(g.sizes()),
             " differs from the tensor's ", shape_str(sizes()));
  }
  get_or_create_meta(*this).grad = g;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  AutogradMeta* m = meta_of(*this);
  return m ? m->grad_fn : nullptr;
}

bool Tensor::is_leaf() const { return grad_fn() == nullptr; }

uint32_t Tensor::output_nr() const {
  AutogradMeta* m = meta_of(*this);
  return m ? m->output_nr : 0;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph, create_graph);
}

Tensor Tensor::detach() const {
  TD_CHECK(defined(), "detach: undefined tensor");
  return Tensor::make(storage(), sizes(), strides(), storage_offset(), dtype());
}

void Tensor::register_hook(Hook hook) const {
  TD_CHECK(requires_grad(), "register_hook: cannot register a hook on a tensor that does not "
           "require grad");
  AutogradMeta& m = get_or_create_meta(*this);
  if (m.grad_fn) {
    m.grad_fn->add_pre_hook(m.output_nr, std::move(hook));
  } else {
    m.leaf_hooks.push_back(std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  TD_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook: only leaf tensors "
           "that require grad accumulate a .grad");
  get_or_create_meta(*this).post_accumulate_hooks.push_back(std::move(hook));
}

void Tensor::retain_grad() const {
  TD_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  AutogradMeta& m = get_or_create_meta(*this);
  if (!m.grad_fn || m.retains_grad) return;  // leaves keep .grad anyway
  m.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_ptr();
  m.grad_fn->add_pre_hook(m.output_nr, [weak](const Tensor& g) -> std::optional<Tensor> {
    if (auto impl = weak.lock()) {
      Tensor self(impl);
      AutogradMeta& mm = get_or_create_meta(self);
      mm.grad = mm.grad.defined() ? add(mm.grad, g.detach()) : g.detach().clone();
    }
    return std::nullopt;
  });
}

}  // namespace td
