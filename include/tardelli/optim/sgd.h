#pragma once
// td::optim::SGD: torch.optim.SGD (maximize=False). Per parameter, with g its gradient:
//   d = g + weight_decay * p                          (when weight_decay != 0)
//   buf = d on the first step, else momentum * buf + (1 - dampening) * d   (momentum != 0)
//   d = nesterov ? d + momentum * buf : buf           (momentum != 0)
//   p -= lr * d
// Computed elementwise in fp32 in one fused pass. The momentum buffer is fp32 for every
// parameter dtype (torch keeps it in the parameter's dtype; for fp32 they are the same).
#include "tardelli/optim/optimizer.h"

namespace td::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;  // requires momentum > 0 and dampening = 0 (as torch)
};

class SGD : public Optimizer {
 public:
  explicit SGD(TensorList params, const SGDOptions& defaults = {});
  explicit SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults = {});

 protected:
  void update_group(const ParamGroup& group, ParamStates& state) override;
  void check_group(const ParamGroup& group) const override;
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
};

}  // namespace td::optim
