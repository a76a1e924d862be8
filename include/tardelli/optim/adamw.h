#pragma once
// td::optim::AdamW: torch.optim.AdamW (amsgrad=False, maximize=False) through the fused
// multi-tensor td::adamw_step (include/tardelli/ops/adamw.h; its Note gives the exact order of
// operations, which is torch's). Moments are fp32 for every parameter dtype; bf16/f16
// parameters are updated in fp32 and rounded once per step, and nothing else is kept for them
// (the fused GPT keeps its own fp32 master weights when it trains in bf16).
#include "tardelli/optim/optimizer.h"

namespace td::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // torch's default
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(TensorList params, const AdamWOptions& defaults = {});
  explicit AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults = {});

 protected:
  void update_group(const ParamGroup& group, ParamStates& state) override;
  void check_group(const ParamGroup& group) const override;
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
};

}  // namespace td::optim
