#include "tardelli/autograd/checkpoint.h"

#include <memory>
#include <utility>

#include "tardelli/autograd/engine.h"
#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/autograd/weight_grad_store.h"

namespace td::autograd {

namespace {

struct RngState {
  uint64_t seed = 0, offset = 0, subsequence = 0;
};

std::vector<RngState> capture(const std::vector<Generator*>& gens) {
  std::vector<RngState> s;
  s.reserve(gens.size());
  for (const Generator* g : gens) s.push_back({g->seed(), g->offset(), g->subsequence()});
  return s;
}

void restore(const std::vector<Generator*>& gens, const std::vector<RngState>& s) {
  for (size_t i = 0; i < gens.size(); ++i)
    gens[i]->set_state(s[i].seed, s[i].offset, s[i].subsequence);
}

// Puts the generators back to `s` on scope exit, also when the recomputation throws.
class RestoreRng {
 public:
  RestoreRng(const std::vector<Generator*>& gens, std::vector<RngState> s)
      : gens_(gens), s_(std::move(s)) {}
  ~RestoreRng() { restore(gens_, s_); }
  RestoreRng(const RestoreRng&) = delete;
  RestoreRng& operator=(const RestoreRng&) = delete;

 private:
  const std::vector<Generator*>& gens_;
  std::vector<RngState> s_;
};

// What the node keeps between forward and backward (Note [Checkpoint]).
struct Saved {
  CheckpointFn fn;
  TensorList inputs;  // detached: the node must not own its inputs' history
  std::vector<bool> input_requires_grad;
  std::vector<Generator*> gens;
  std::vector<RngState> before, after;  // the generators around the forward
  std::vector<size_t> diff_outputs;     // which of fn's outputs the node produced
  std::vector<Shape> output_shapes;
};

TensorList recompute_backward(Saved& s, const TensorList& grads) {
  TD_CHECK(!grad_enabled(),
           "checkpoint: double backward (create_graph=true) through a checkpointed function is "
           "not supported");
  TensorList inputs(s.inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!s.inputs[i].defined()) continue;
    inputs[i] = s.inputs[i].detach();
    if (s.input_requires_grad[i]) inputs[i].set_requires_grad(true);
  }
  TensorList outs;
  {
    RestoreRng back(s.gens, capture(s.gens));  // the streams as backward found them
    restore(s.gens, s.before);
    GradModeGuard on(true);
    outs = s.fn(inputs);
    const std::vector<RngState> end = capture(s.gens);
    for (size_t i = 0; i < end.size(); ++i) {
      TD_CHECK(end[i].offset == s.after[i].offset && end[i].seed == s.after[i].seed &&
                   end[i].subsequence == s.after[i].subsequence,
               "checkpoint: the recomputation left generator ", i, " at offset ", end[i].offset,
               " where the forward left it at ", s.after[i].offset,
               ": the function drew a different amount of random numbers the second time (it "
               "must be deterministic given its inputs and the listed generators)");
    }
  }
  TensorList roots, root_grads;
  for (size_t j = 0; j < s.diff_outputs.size(); ++j) {
    const size_t k = s.diff_outputs[j];
    TD_CHECK(k < outs.size() && outs[k].defined() && outs[k].sizes() == s.output_shapes[j],
             "checkpoint: the recomputation returned ", outs.size(),
             " outputs whose shapes differ from the forward's (output ", k, ")");
    if (!grads[j].defined() || !outs[k].requires_grad()) continue;
    roots.push_back(outs[k]);
    root_grads.push_back(grads[j]);
  }
  if (!roots.empty()) {
    // Under backward_input the recomputed GEMMs defer their weight gradients into the current
    // batch; their closures may backpropagate through cast nodes of this graph later, so it is
    // retained (it is freed when the closures are).
    backward(roots, root_grads, /*retain_graph=*/deferring_weight_grads());
  }
  TensorList result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (s.input_requires_grad[i]) result.push_back(inputs[i].grad());
  }
  return result;
}

}  // namespace

TensorList checkpoint(CheckpointFn fn, const TensorList& inputs, const CheckpointOptions& options) {
  TD_CHECK(fn != nullptr, "checkpoint: the function is empty");
  for (const Generator* g : options.generators) {
    TD_CHECK(g != nullptr, "checkpoint: a listed generator is null");
  }
  if (!needs_grad(inputs)) return fn(inputs);

  auto s = std::make_shared<Saved>();
  s->gens = options.generators;
  s->before = capture(s->gens);
  TensorList outs;
  {
    NoGradGuard ng;
    TensorList detached(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined()) detached[i] = inputs[i].detach();
    }
    outs = fn(detached);
  }
  s->after = capture(s->gens);
  TensorList diff_inputs;
  for (const Tensor& t : inputs) {
    const bool rg = t.defined() && t.requires_grad();
    s->input_requires_grad.push_back(rg);
    s->inputs.push_back(t.defined() ? t.detach() : Tensor());
    if (rg) diff_inputs.push_back(t);
  }
  std::vector<Tensor*> diff_outs;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].defined()) continue;
    // A fresh handle per output: an output that is an input (or a view of one) must not have
    // the input's history replaced.
    outs[k] = outs[k].detach();
    if (!outs[k].is_floating_point()) continue;
    s->diff_outputs.push_back(k);
    s->output_shapes.push_back(outs[k].sizes());
    diff_outs.push_back(&outs[k]);
  }
  s->fn = std::move(fn);
  if (diff_outs.empty()) return outs;
  record("CheckpointBackward", diff_inputs, diff_outs,
         [s](const TensorList& g, const std::vector<bool>&) { return recompute_backward(*s, g); });
  return outs;
}

}  // namespace td::autograd
