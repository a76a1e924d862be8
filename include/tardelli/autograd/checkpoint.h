#pragma once
// Activation checkpointing (torch.utils.checkpoint, reentrant form): trade compute for memory by
// keeping only a function's inputs and running it again in backward.
//
// Note [Checkpoint]: checkpoint(fn, inputs) runs fn under no-grad, so none of its intermediate
// tensors are saved, and records one node ("CheckpointBackward") from the inputs to the outputs.
// That node holds the inputs (the only activations kept) and fn itself. In backward it
//   1. sets every listed generator back to the state it had before the forward (RNG replay),
//   2. runs fn again with grad mode on, on detached copies of the inputs that require grad,
//   3. restores the generators to the state they had when backward reached the node,
//   4. backpropagates the incoming gradients through that fresh graph with the ordinary engine,
// and returns the gradients that reached the detached inputs. Step 4 is a real backward:
// parameters used inside fn get their gradients through their own AccumulateGrad (so .grad
// accumulates as usual and post-accumulate hooks, e.g. data-parallel buckets, fire), collectives
// recorded by fn run again in the same order on every rank, and under backward_input (Note
// [Deferred weight gradients]) the recomputed GEMMs defer their weight gradients like any other.
//
// Bitwise equality with running fn directly holds when fn is deterministic given its inputs and
// the listed generators' states (the library's ops are: "Determinism by default" in
// docs/architecture.md): the recomputation then produces the same tensors, and the backward runs
// the same kernels on them. A recomputation that leaves a listed generator at another offset than
// the forward did is a td::Error (fn drew a different amount of random numbers: it depends on
// something that changed between forward and backward).
#include <functional>
#include <vector>

#include "tardelli/core/rng.h"
#include "tardelli/core/tensor.h"

namespace td::autograd {

using CheckpointFn = std::function<TensorList(const TensorList&)>;

struct CheckpointOptions {
  // The generators fn draws from (dropout streams). Their states before the forward are saved
  // and replayed in the recomputation, so the same units are dropped. The pointers must stay
  // valid until the node is released (the generators belong to the model, which outlives its
  // backward). torch's preserve_rng_state for explicitly named streams.
  std::vector<Generator*> generators;
};

// Returns fn(inputs). Under grad mode with at least one input requiring grad, only `inputs` (and
// fn, with whatever it captured) are kept for backward; fn runs a second time in backward. fn
// must not modify its inputs, and the tensors it uses besides its inputs must be leaves (model
// parameters) or not require grad: the recomputed graph is backpropagated on its own, so a
// non-leaf from the surrounding graph would be run through twice. Outputs must be floating
// point. Without grad mode, or when no input requires grad, fn simply runs with history (the
// gradients are the same; nothing is saved by checkpointing). Double backward (create_graph)
// through a checkpoint is a td::Error.
TensorList checkpoint(CheckpointFn fn, const TensorList& inputs,
                      const CheckpointOptions& options = {});

}  // namespace td::autograd
