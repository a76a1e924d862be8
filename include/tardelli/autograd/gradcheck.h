#pragma once
// Finite-difference gradient checking: compares the analytic gradient of sum(f(inputs) * w) for
// a random projection w against central differences, element by element.
#include <functional>
#include <string>

#include "tardelli/core/tensor.h"

namespace td::autograd {

struct GradcheckOptions {
  double eps = 1e-3;   // step of the central difference (inputs are fp32)
  double atol = 1e-3;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-2;
  uint64_t seed = 0;   // for the projection weights
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_err = 0;
  std::string message;  // the first failing input and element, when !ok
};

// `inputs` must be float32 tensors with requires_grad set on those to check.
GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f,
                          const TensorList& inputs, const GradcheckOptions& opts = {});

}  // namespace td::autograd
