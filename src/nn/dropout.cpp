#include "tardelli/nn/dropout.h"

#include "tardelli/ops/dropout.h"

namespace td::nn {

Dropout::Dropout(double p, Generator* gen) : UnaryModule("Dropout"), p_(p), gen_(gen) {
  TD_CHECK(p >= 0 && p <= 1, "Dropout: probability must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  return dropout(x, p_, is_training(), gen_);
}

}  // namespace td::nn
