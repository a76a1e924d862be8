#pragma once
// The backward engine: runs the graph from the roots in dependency order (a node runs once all
// gradients for its outputs have arrived), summing gradients that meet at a node.
#include "tardelli/autograd/node.h"

namespace td::autograd {

// Backpropagates `grad_roots` (one per root; undefined means ones for one-element roots).
// With retain_graph=false the saved tensors are freed as nodes finish. With create_graph the
// backward ops themselves are recorded (higher-order gradients).
void backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph = false,
              bool create_graph = false);

// torch.autograd.grad: returns d(sum roots*grad_roots)/d inputs without touching .grad.
TensorList grad(const TensorList& roots, const TensorList& inputs, const TensorList& grad_roots,
                bool retain_graph = false, bool create_graph = false, bool allow_unused = false);

}  // namespace td::autograd
