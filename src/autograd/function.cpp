#include "tardelli/autograd/function.h"

namespace td::autograd {

FunctionNode::FunctionNode(std::string name, uint32_t num_outputs, BackwardFn fn)
    : Node(num_outputs), name_(std::move(name)), fn_(std::move(fn)) {}

TensorList FunctionNode::apply(TensorList&& grads) {
  TD_CHECK(fn_ != nullptr, "autograd: trying to backward through ", name_,
           " a second time, but its saved tensors were already freed; call backward(retain_graph="
           "true) the first time if you need to backward through the graph twice");
  std::vector<bool> need(next_edges().size());
  for (size_t i = 0; i < need.size(); ++i) need[i] = needs_input_grad(i);
  TensorList out = fn_(grads, need);
  TD_CHECK(out.size() == next_edges().size(), "autograd: backward of ", name_, " returned ",
           out.size(), " gradients for ", next_edges().size(), " inputs");
  return out;
}

bool needs_grad(std::initializer_list<Tensor> inputs) {
  if (!grad_enabled()) return false;
  for (const auto& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

bool needs_grad(const TensorList& inputs) {
  if (!grad_enabled()) return false;
  for (const auto& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(const char* name, const TensorList& inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn fn) {
  record(name, inputs, std::vector<Tensor*>(outputs), std::move(fn));
}

void record(const char* name, const TensorList& inputs, const std::vector<Tensor*>& outputs,
            BackwardFn fn) {
  auto node =
      std::make_shared<FunctionNode>(name, static_cast<uint32_t>(outputs.size()), std::move(fn));
  auto& edges = node->mutable_next_edges();
  edges.reserve(inputs.size());
  for (const auto& t : inputs) {
    edges.push_back(t.defined() && t.requires_grad() ? gradient_edge(t) : Edge{});
  }
  uint32_t nr = 0;
  for (Tensor* out : outputs) {
    AutogradMeta& m = get_or_create_meta(*out);
    m.grad_fn = node;
    m.output_nr = nr++;
    m.requires_grad = true;
  }
}

}  // namespace td::autograd
