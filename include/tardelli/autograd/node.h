#pragma once
// The autograd graph. Each differentiable op that ran with grad enabled leaves a Node that maps
// gradients w.r.t. its outputs to gradients w.r.t. its inputs; Edges point to the Nodes that
// produced those inputs (or to AccumulateGrad for leaves). See docs/architecture.md.
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;  // which of fn's inputs (= which output of the forward op)
  bool valid() const { return fn != nullptr; }
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(uint32_t num_inputs);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grads[i] is the gradient w.r.t. forward output i (undefined if none flowed); returns one
  // gradient per next edge (undefined allowed where the input needs none).
  virtual TensorList apply(TensorList&& grads) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors once the graph has been run without retain_graph.
  virtual void release_variables() {}
  virtual bool released() const { return false; }

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  std::vector<Edge>& mutable_next_edges() { return next_edges_; }
  uint32_t num_inputs() const { return num_inputs_; }
  uint64_t sequence_nr() const { return sequence_nr_; }
  bool needs_input_grad(size_t i) const {
    return i < next_edges_.size() && next_edges_[i].valid();
  }

  // Hooks on the gradient of forward output `output_nr` (tensor.register_hook on non-leaves).
  void add_pre_hook(uint32_t output_nr, Tensor::Hook hook);
  // Applied by the engine before apply().
  void run_pre_hooks(TensorList& grads) const;

 private:
  uint32_t num_inputs_;
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
  std::vector<std::pair<uint32_t, Tensor::Hook>> pre_hooks_;
};

// Per-tensor autograd state.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  std::weak_ptr<Node> grad_accumulator;  // AccumulateGrad of a leaf, made on first use
  uint32_t output_nr = 0;
  std::vector<Tensor::Hook> leaf_hooks;  // leaves: run on the incoming grad before accumulating
  std::vector<std::function<void(const Tensor&)>> post_accumulate_hooks;
  bool retains_grad = false;
};

AutogradMeta& get_or_create_meta(const Tensor& t);
AutogradMeta* meta_of(const Tensor& t);  // null if none

// Whether g is a contiguous gradient buffer that nothing else holds: the only handle to its
// tensor and to its storage (no view of it, no other slot or saved variable). The engine sums
// further gradients into such a buffer in place, and AccumulateGrad keeps it as .grad without a
// copy (Note [In-place gradient accumulation]).
bool is_sole_buffer(const Tensor& g);

// Accumulates into a leaf's .grad (sum over all uses), then runs post-accumulate hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  const Tensor& variable() const { return leaf_; }

 private:
  Tensor leaf_;
};

// The edge a gradient w.r.t. `t` must flow along: its grad_fn, its AccumulateGrad if it is a
// leaf that requires grad, or an invalid edge.
Edge gradient_edge(const Tensor& t);

}  // namespace td::autograd
