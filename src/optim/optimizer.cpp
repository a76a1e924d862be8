#include "tardelli/optim/optimizer.h"

#include <algorithm>
#include <set>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"

namespace td::optim {

double ParamGroup::option(const std::string& key) const {
  auto it = options.find(key);
  TD_CHECK(it != options.end(), "ParamGroup: no option '", key, "'");
  return it->second;
}

Optimizer::Optimizer(std::string name, double default_lr, double default_weight_decay,
                     std::map<std::string, double> default_options)
    : name_(std::move(name)),
      default_lr_(default_lr),
      default_weight_decay_(default_weight_decay),
      default_options_(std::move(default_options)) {}

void Optimizer::init(std::vector<ParamGroup> groups) {
  size_t total = 0;
  for (const auto& g : groups) total += g.params.size();
  TD_CHECK(!groups.empty() && total > 0, name_, ": optimizer got an empty parameter list");
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  if (!group.lr) group.lr = default_lr_;
  if (!group.weight_decay) group.weight_decay = default_weight_decay_;
  for (const auto& [k, v] : group.options) {
    TD_CHECK(default_options_.count(k), name_, ": unknown option '", k, "' in a parameter group");
  }
  for (const auto& [k, v] : default_options_) group.options.emplace(k, v);  // keeps given keys
  std::set<const TensorImpl*> seen;
  for (const auto& g : groups_) {
    for (const auto& p : g.params) seen.insert(p.impl());
  }
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    TD_CHECK(p.defined(), name_, ": parameter ", i, " of a group is an undefined tensor");
    TD_CHECK(p.is_floating_point(), name_, ": can only optimize floating point tensors, got ",
             describe(p), " (parameter ", i, ")");
    TD_CHECK(p.is_leaf(), name_, ": can't optimize a non-leaf tensor ", describe(p), " (parameter ",
             i, ")");
    TD_CHECK(p.is_cpu() || p.is_cuda(), name_, ": parameter ", i, " is on ", p.device().str(),
             ", which no optimizer supports");
    TD_CHECK(seen.insert(p.impl()).second, name_,
             ": some parameters appear in more than one parameter group (or twice in one)");
  }
  check_group(group);
  state_.emplace_back(group.params.size());
  groups_.push_back(std::move(group));
}

void Optimizer::step() {
  autograd::NoGradGuard ng;
  for (size_t g = 0; g < groups_.size(); ++g) {
    check_group(groups_[g]);  // a scheduler or a user may have changed the hyperparameters
    update_group(groups_[g], state_[g]);
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  autograd::NoGradGuard ng;
  for (auto& g : groups_) {
    for (auto& p : g.params) {
      Tensor gr = p.grad();
      if (!gr.defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        gr.zero_();
      }
    }
  }
}

void Optimizer::set_lr(double lr) {
  TD_CHECK(lr >= 0, name_, ".set_lr: lr must be >= 0, got ", lr);
  for (auto& g : groups_) g.lr = lr;
}

OptimizerState Optimizer::state_dict() const {
  OptimizerState sd;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    OptimizerState::Group og;
    og.lr = *groups_[g].lr;
    og.weight_decay = *groups_[g].weight_decay;
    og.options = groups_[g].options;
    for (size_t i = 0; i < groups_[g].params.size(); ++i, ++index) {
      og.params.push_back(index);
      const auto& st = state_[g][i];
      if (st.step == 0 && st.tensors.empty()) continue;
      OptimizerState::Param ps;
      ps.step = st.step;
      for (const auto& [k, t] : st.tensors) ps.tensors[k] = t.detach();
      sd.state[index] = std::move(ps);
    }
    sd.groups.push_back(std::move(og));
  }
  return sd;
}

void Optimizer::load_state_dict(const OptimizerState& sd) {
  const std::string who = name_ + ".load_state_dict";
  TD_CHECK(sd.groups.size() == groups_.size(), who, ": the state has ", sd.groups.size(),
           " parameter groups, the optimizer ", groups_.size());
  // Global index -> (group, position), from the optimizer's own numbering.
  std::vector<std::pair<size_t, size_t>> where;
  for (size_t g = 0; g < groups_.size(); ++g) {
    TD_CHECK(sd.groups[g].params.size() == groups_[g].params.size(), who, ": group ", g, " has ",
             sd.groups[g].params.size(), " parameters in the state, ", groups_[g].params.size(),
             " in the optimizer");
    for (size_t i = 0; i < groups_[g].params.size(); ++i) where.emplace_back(g, i);
    for (const auto& [k, v] : sd.groups[g].options) {
      TD_CHECK(default_options_.count(k), who, ": unknown option '", k, "' in group ", g);
    }
    TD_CHECK(sd.groups[g].lr >= 0, who, ": group ", g, " has negative lr ", sd.groups[g].lr);
  }
  const auto names = state_names();
  // Validate everything before changing anything.
  for (const auto& [index, ps] : sd.state) {
    TD_CHECK(index >= 0 && index < static_cast<int64_t>(where.size()), who,
             ": state for parameter ", index, " but the optimizer has ", where.size());
    TD_CHECK(ps.step >= 0, who, ": negative step ", ps.step, " for parameter ", index);
    const Tensor& p = groups_[where[index].first].params[where[index].second];
    for (const auto& [k, t] : ps.tensors) {
      TD_CHECK(std::find(names.begin(), names.end(), k) != names.end(), who, ": unknown state '", k,
               "' for parameter ", index);
      TD_CHECK(t.defined() && t.sizes() == p.sizes(), who, ": state '", k, "' of parameter ", index,
               " has shape ", t.defined() ? shape_str(t.sizes()) : std::string("undefined"),
               ", the parameter ", shape_str(p.sizes()));
      TD_CHECK(t.is_floating_point(), who, ": state '", k, "' of parameter ", index,
               " must be floating point, got ", describe(t));
    }
  }
  autograd::NoGradGuard ng;
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = sd.groups[g].lr;
    groups_[g].weight_decay = sd.groups[g].weight_decay;
    for (const auto& [k, v] : sd.groups[g].options) groups_[g].options[k] = v;
    for (auto& st : state_[g]) st = OptimizerState::Param();
  }
  for (const auto& [index, ps] : sd.state) {
    auto& st = state_[where[index].first][where[index].second];
    const Device device = groups_[where[index].first].params[where[index].second].device();
    st.step = ps.step;
    for (const auto& [k, t] : ps.tensors) {
      // Optimizer state is fp32 on the parameter's device (Note [Optimizer state dict]: a copy,
      // never an alias).
      Tensor c = Tensor::empty(t.sizes(), DType::Float32, device);
      copy_into(c, t);
      st.tensors[k] = c;
    }
  }
}

}  // namespace td::optim
