#pragma once
// td::nn::GELU (torch.nn.GELU(approximate="none" | "tanh")).
#include <string>

#include "tardelli/nn/linear.h"
#include "tardelli/ops/activation.h"

namespace td::nn {

class GELU : public UnaryModule {
 public:
  explicit GELU(const std::string& approximate = "none");
  explicit GELU(GeluApprox approximate);
  Tensor forward(const Tensor& x) override;
  GeluApprox approximate() const { return approx_; }

 private:
  GeluApprox approx_;
};

}  // namespace td::nn
