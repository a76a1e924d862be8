#pragma once
// Recording differentiable ops. An op computes its outputs, then, if any input requires grad
// (and grad mode is on), records a FunctionNode whose backward is a lambda next to the forward:
//
//   Tensor out = ...forward...;
//   if (autograd::needs_grad({a, b}))
//     autograd::record("mul", {a, b}, {&out},
//         [a, b](const TensorList& g, const std::vector<bool>& need) -> TensorList {
//           return {need[0] ? mul(g[0], b) : Tensor(), need[1] ? mul(g[0], a) : Tensor()};
//         });
//
// The lambda's captures are the saved tensors; releasing the graph destroys the lambda.
#include <functional>
#include <initializer_list>
#include <string>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/autograd/node.h"

namespace td::autograd {

using BackwardFn =
    std::function<TensorList(const TensorList& grads, const std::vector<bool>& need)>;

class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, uint32_t num_outputs, BackwardFn fn);
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return name_; }
  void release_variables() override { fn_ = nullptr; }
  bool released() const override { return !fn_; }

 private:
  std::string name_;
  BackwardFn fn_;
  std::vector<Shape> output_shapes_;
  std::vector<DType> output_dtypes_;
  friend void record(const char*, const TensorList&, std::initializer_list<Tensor*>, BackwardFn);
};

// True if grad mode is on and any defined input requires grad.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const TensorList& inputs);

// Attaches a node to `outputs` (which become non-leaves requiring grad). `inputs` are the
// differentiable inputs in the order the lambda returns their gradients.
void record(const char* name, const TensorList& inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn fn);
// The same for a number of outputs known at run time (e.g. split).
void record(const char* name, const TensorList& inputs, const std::vector<Tensor*>& outputs,
            BackwardFn fn);

}  // namespace td::autograd
