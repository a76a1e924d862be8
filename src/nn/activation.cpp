#include "tardelli/nn/activation.h"

namespace td::nn {

GELU::GELU(const std::string& approximate)
    : UnaryModule("GELU"), approx_(parse_gelu_approx(approximate)) {}

GELU::GELU(GeluApprox approximate) : UnaryModule("GELU"), approx_(approximate) {}

Tensor GELU::forward(const Tensor& x) {
  return gelu(x, approx_);
}

}  // namespace td::nn
