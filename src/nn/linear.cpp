#include "tardelli/nn/linear.h"

#include <cmath>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/matmul.h"

namespace td::nn {

namespace {

// U(-bound, bound) as a fresh leaf tensor.
Tensor uniform(const Shape& shape, double bound, Generator* gen) {
  autograd::NoGradGuard ng;
  Tensor u = rand(shape, {}, gen);
  return sub(mul(u, 2.0 * bound), bound);
}

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator* gen)
    : UnaryModule("Linear"), in_features_(in_features), out_features_(out_features) {
  TD_CHECK(in_features >= 0 && out_features >= 0,
           "Linear: in_features and out_features must be >= 0, got ", in_features, " and ",
           out_features);
  // torch: kaiming_uniform_(a=sqrt(5)) gives bound = sqrt(6 / ((1 + 5) fan_in)) = 1/sqrt(fan_in);
  // the bias uses the same bound (0 when fan_in = 0).
  const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
  weight = register_parameter("weight", uniform({out_features, in_features}, bound, gen));
  if (bias) this->bias = register_parameter("bias", uniform({out_features}, bound, gen));
}

Tensor Linear::forward(const Tensor& x) {
  TD_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features_, "Linear.forward: input ",
           x.defined() ? describe(x) : std::string("undefined"), " must have last dim ",
           in_features_, " (weight ", describe(weight), ")");
  return linear(x, weight, bias);
}

void Linear::tie_weight(const Tensor& w) {
  TD_CHECK(w.defined() && w.sizes() == Shape({out_features_, in_features_}),
           "Linear.tie_weight: expected a tensor of shape ",
           shape_str({out_features_, in_features_}), ", got ",
           w.defined() ? describe(w) : std::string("undefined"));
  replace_parameter("weight", w);
  weight = w;
}

}  // namespace td::nn
