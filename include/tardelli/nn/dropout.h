#pragma once
// td::nn::Dropout (torch.nn.Dropout): active only in training mode (Module::is_training()).
#include "tardelli/core/rng.h"
#include "tardelli/nn/linear.h"

namespace td::nn {

// Zeroes each element with probability p and scales the rest by 1/(1-p) while training; the
// identity in eval mode or when p = 0. Masks come from `gen` (the default generator when null;
// the generator must outlive the module).
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  double p() const { return p_; }

 private:
  double p_;
  Generator* gen_;
};

}  // namespace td::nn
