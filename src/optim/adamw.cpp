#include "tardelli/optim/adamw.h"

#include <map>

#include "tardelli/ops/adamw.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"

namespace td::optim {

namespace {

std::map<std::string, double> adamw_defaults(const AdamWOptions& o) {
  return {{"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}};
}

}  // namespace

AdamW::AdamW(TensorList params, const AdamWOptions& defaults)
    : AdamW(std::vector<ParamGroup>{ParamGroup(std::move(params))}, defaults) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults)
    : Optimizer("AdamW", defaults.lr, defaults.weight_decay, adamw_defaults(defaults)) {
  init(std::move(groups));
}

void AdamW::check_group(const ParamGroup& g) const {
  const double b1 = g.option("beta1"), b2 = g.option("beta2"), eps = g.option("eps");
  TD_CHECK(*g.lr >= 0, "AdamW: invalid learning rate ", *g.lr);
  TD_CHECK(eps >= 0, "AdamW: invalid epsilon ", eps);
  TD_CHECK(b1 >= 0 && b1 < 1, "AdamW: invalid beta1 ", b1, " (must be in [0, 1))");
  TD_CHECK(b2 >= 0 && b2 < 1, "AdamW: invalid beta2 ", b2, " (must be in [0, 1))");
  TD_CHECK(*g.weight_decay >= 0, "AdamW: invalid weight_decay ", *g.weight_decay);
}

// Note [AdamW buckets]: td::adamw_step takes one step count for its whole list, while torch
// keeps a step per parameter (a parameter that had no gradient on some step is behind). We
// group the parameters by their step count and make one fused call per distinct count, which
// is a single call in the usual case.
void AdamW::update_group(const ParamGroup& group, ParamStates& state) {
  struct Item {
    Tensor param, work, grad;  // work: param itself, or a contiguous copy to write back
    OptimizerState::Param* st;
  };
  std::map<int64_t, std::vector<Item>> buckets;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    TD_CHECK(g.sizes() == p.sizes(), "AdamW.step: gradient ", describe(g),
             " does not match parameter ", describe(p));
    if (g.dtype() != p.dtype() && g.dtype() != DType::Float32) g = g.to(DType::Float32);
    if (!g.is_contiguous()) g = g.contiguous();
    auto& st = state[i];
    if (st.tensors.empty()) {
      st.tensors["exp_avg"] = zeros(p.sizes(), {DType::Float32, p.device()});
      st.tensors["exp_avg_sq"] = zeros(p.sizes(), {DType::Float32, p.device()});
    }
    st.step += 1;
    buckets[st.step].push_back({p, p.is_contiguous() ? p : p.contiguous(), g, &st});
  }
  AdamWConfig cfg;
  cfg.lr = *group.lr;
  cfg.weight_decay = *group.weight_decay;
  cfg.beta1 = group.option("beta1");
  cfg.beta2 = group.option("beta2");
  cfg.eps = group.option("eps");
  for (auto& [step, items] : buckets) {
    TensorList ps, gs, ms, vs;
    for (auto& it : items) {
      ps.push_back(it.work);
      gs.push_back(it.grad);
      ms.push_back(it.st->tensors.at("exp_avg"));
      vs.push_back(it.st->tensors.at("exp_avg_sq"));
    }
    cfg.step = step;
    adamw_step(ps, gs, ms, vs, cfg);
    for (auto& it : items) {
      if (!it.work.is_same(it.param)) copy_into(it.param, it.work);
    }
  }
}

}  // namespace td::optim
