#pragma once
// td::optim::Optimizer: torch.optim.Optimizer's contract in C++. Parameters come in groups,
// each with its own lr, weight_decay and optimizer-specific options; step() updates every
// parameter that has a gradient, under NoGradGuard; gradients accumulate across backward()
// calls until zero_grad(), so gradient accumulation needs nothing special.
//
// Note [Optimizer state dict]: state_dict() mirrors torch's packed layout: parameters are
// numbered 0, 1, ... in group order, per-parameter state (step count and named tensors such as
// exp_avg) is keyed by that index, and each group records its indices and hyperparameters.
// load_state_dict() checks the layout (group count, group sizes, state tensor shapes) and
// copies the tensors, so the loaded optimizer never aliases the dict it was given.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::optim {

struct ParamGroup {
  ParamGroup() = default;
  ParamGroup(TensorList params, std::optional<double> lr = std::nullopt,
             std::optional<double> weight_decay = std::nullopt,
             std::map<std::string, double> options = {})
      : params(std::move(params)),
        lr(lr),
        weight_decay(weight_decay),
        options(std::move(options)) {}

  TensorList params;
  // Unset on construction: the optimizer's default. After the optimizer is built every group
  // has lr, weight_decay and every option key of that optimizer set (schedulers write lr).
  std::optional<double> lr;
  std::optional<double> weight_decay;
  // Optimizer-specific hyperparameters ("beta1", "beta2", "eps" for AdamW; "momentum",
  // "dampening", "nesterov" (0/1) for SGD). An unknown key is a td::Error.
  std::map<std::string, double> options;

  double option(const std::string& key) const;  // td::Error if absent
};

struct OptimizerState {
  struct Param {
    int64_t step = 0;                       // updates applied to this parameter
    std::map<std::string, Tensor> tensors;  // e.g. exp_avg, exp_avg_sq, momentum_buffer
  };
  struct Group {
    std::vector<int64_t> params;  // indices into the global numbering
    double lr = 0;
    double weight_decay = 0;
    std::map<std::string, double> options;
  };
  std::map<int64_t, Param> state;  // only parameters that have state
  std::vector<Group> groups;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update to every parameter with a defined gradient (others are skipped, as in
  // torch). Runs under NoGradGuard.
  void step();
  // Clears gradients: set_to_none drops them (torch's default), otherwise fills them with 0.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Adds a group (defaults filled in, checked like the constructor's groups).
  void add_param_group(ParamGroup group);
  // Sets lr on every group (what a scheduler does).
  void set_lr(double lr);

  // The state tensors are shared with the optimizer (like torch); load copies them.
  OptimizerState state_dict() const;
  void load_state_dict(const OptimizerState& sd);

  const std::string& name() const { return name_; }

 protected:
  // The defaults: lr, weight_decay and every option key this optimizer knows. A derived
  // constructor then calls init(groups) (virtual checks cannot run in this constructor).
  Optimizer(std::string name, double default_lr, double default_weight_decay,
            std::map<std::string, double> default_options);
  // Adds the groups; an empty list (or groups with no parameters at all) is a td::Error.
  void init(std::vector<ParamGroup> groups);

  // Per-parameter state, parallel to groups_[g].params.
  using ParamStates = std::vector<OptimizerState::Param>;
  // Updates the parameters of one group that have gradients. `state[i]` belongs to
  // group.params[i]; an empty `tensors` map means the parameter has no state yet.
  virtual void update_group(const ParamGroup& group, ParamStates& state) = 0;
  // Checks a group's hyperparameters (lr >= 0 etc.); called after defaults are filled in.
  virtual void check_group(const ParamGroup& group) const = 0;
  // The state tensor names this optimizer keeps per parameter (for load_state_dict checks).
  virtual std::vector<std::string> state_names() const = 0;

 private:
  std::string name_;
  double default_lr_, default_weight_decay_;
  std::map<std::string, double> default_options_;
  std::vector<ParamGroup> groups_;
  std::vector<ParamStates> state_;  // parallel to groups_
};

}  // namespace td::optim
