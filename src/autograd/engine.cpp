#include "tardelli/autograd/engine.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"

namespace td::autograd {
namespace {

// Note [Engine]: a node becomes ready when every edge into it has delivered (its dependency
// count reaches zero). Among ready nodes the most recently created runs first, which keeps
// memory low on a sequential model (each layer's activations are freed right after its backward).
// AccumulateGrad nodes go before everything else (as in PyTorch): a leaf's gradient is complete
// the moment its node is ready, and accumulating it at once frees the incoming buffer (summed
// into .grad, or handed to a DDP bucket / reduce-scatter by the post-accumulate hooks). By
// creation order alone the leaves, created before any op, would run last, and every gradient
// of a model whose .grad already exists (gradient accumulation) would be held to the end of
// backward: one extra copy of all gradients at the peak.
struct Ready {
  bool leaf;
  uint64_t sequence_nr;
  Node* node;
  bool operator<(const Ready& o) const {
    return leaf != o.leaf ? o.leaf : sequence_nr < o.sequence_nr;
  }
};

Ready make_ready(Node* n) {
  return {dynamic_cast<AccumulateGrad*>(n) != nullptr, n->sequence_nr(), n};
}

struct Capture {
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> at;  // node -> (input, slot)
  TensorList grads;
};

// Note [In-place gradient accumulation]: a tensor that feeds several ops (the residual stream,
// tied embeddings) gets one gradient per use, summed here. When the slot is a sole buffer
// (is_sole_buffer: no view of it, no other slot or saved variable holding it; a node may pass
// one tensor to several edges) and g has its shape, dtype and device, g is added into it in
// place: no new buffer and one pass fewer. Otherwise, and always when the backward itself is
// recorded (create_graph), the sum is a new tensor. AccumulateGrad decides by the same test
// whether it may keep an incoming buffer as .grad.
bool can_add_in_place(const Tensor& slot, const Tensor& g) {
  return !grad_enabled() && is_sole_buffer(slot) && !slot.requires_grad() &&
         slot.sizes() == g.sizes() && slot.dtype() == g.dtype() && slot.device() == g.device();
}

void accumulate(Tensor& slot, Tensor g) {
  if (!slot.defined()) {
    slot = std::move(g);
  } else if (can_add_in_place(slot, g)) {
    add_(slot, g);
  } else {
    slot = add(slot, g);
  }
}

void run(const TensorList& roots, const TensorList& grad_roots, bool retain_graph,
         bool create_graph, Capture* capture) {
  TD_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward: got ",
           grad_roots.size(), " gradients for ", roots.size(), " tensors");
  GradModeGuard mode(create_graph);

  std::unordered_map<Node*, TensorList> buffers;
  std::unordered_map<Node*, int> deps;
  std::vector<std::shared_ptr<Node>> keep_alive;

  std::vector<Edge> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    TD_CHECK(r.defined(), "backward: root ", i, " is undefined");
    Edge e = gradient_edge(r);
    TD_CHECK(e.valid(), "backward: element ", i, " of the tensors (", describe(r),
             ") does not require grad and has no grad_fn");
    Tensor g = grad_roots.empty() ? Tensor() : grad_roots[i];
    if (!g.defined()) {
      TD_CHECK(r.numel() == 1,
               "backward: grad can be implicitly created only for one-element "
               "outputs; got ",
               describe(r), " (pass a gradient)");
      g = ones_like(r);
    } else {
      TD_CHECK(g.sizes() == r.sizes(), "backward: gradient shape ", shape_str(g.sizes()),
               " does not match the tensor's shape ", shape_str(r.sizes()));
    }
    auto& buf = buffers[e.fn.get()];
    buf.resize(e.fn->num_inputs());
    accumulate(buf[e.input_nr], g);
    root_edges.push_back(e);
  }

  // Dependency counts over the reachable graph.
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const auto& e : root_edges) {
    if (seen.insert(e.fn.get()).second) {
      stack.push_back(e.fn.get());
      keep_alive.push_back(e.fn);
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges()) {
      if (!e.valid()) continue;
      deps[e.fn.get()]++;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  std::priority_queue<Ready> ready;
  for (const auto& e : root_edges) {
    if (deps[e.fn.get()] == 0) {
      deps[e.fn.get()] = -1;  // queued
      ready.push(make_ready(e.fn.get()));
    }
  }

  while (!ready.empty()) {
    Node* n = ready.top().node;
    ready.pop();
    TensorList grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(n->num_inputs());
    n->run_pre_hooks(grads);
    bool skip = false;
    if (capture) {
      auto it = capture->at.find(n);
      if (it != capture->at.end()) {
        for (auto [input_nr, slot] : it->second) capture->grads[slot] = grads[input_nr];
      }
      skip = dynamic_cast<AccumulateGrad*>(n) != nullptr;  // grad() never touches .grad
    }
    // A node that received no gradient at all (every path into it carried none, e.g. a weight
    // whose gradient was deferred: Note [Deferred weight gradients]) has nothing to pass on.
    if (!skip &&
        std::none_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); }))
      skip = true;
    TensorList out;
    if (!skip) {
      out = n->apply(std::move(grads));
      if (!retain_graph) n->release_variables();
    }
    const auto& edges = n->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      if (i < out.size() && out[i].defined()) {
        auto& buf = buffers[e.fn.get()];
        buf.resize(e.fn->num_inputs());
        accumulate(buf[e.input_nr], std::move(out[i]));
      }
      if (--deps[e.fn.get()] == 0) {
        deps[e.fn.get()] = -1;
        ready.push(make_ready(e.fn.get()));
      }
    }
  }
}

}  // namespace

void backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph,
              bool create_graph) {
  run(roots, grad_roots, retain_graph || create_graph, create_graph, nullptr);
}

TensorList grad(const TensorList& roots, const TensorList& inputs, const TensorList& grad_roots,
                bool retain_graph, bool create_graph, bool allow_unused) {
  Capture cap;
  cap.grads.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Edge e = gradient_edge(inputs[i]);
    TD_CHECK(e.valid(), "autograd.grad: input ", i, " (", describe(inputs[i]),
             ") does not require grad");
    cap.at[e.fn.get()].emplace_back(e.input_nr, i);
  }
  run(roots, grad_roots, retain_graph || create_graph, create_graph, &cap);
  for (size_t i = 0; i < inputs.size(); ++i) {
    TD_CHECK(allow_unused || cap.grads[i].defined(), "autograd.grad: input ", i,
             " was not used in the graph (pass allow_unused=true)");
  }
  return cap.grads;
}

}  // namespace td::autograd
