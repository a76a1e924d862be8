#include "tardelli/nn/norm.h"

#include <utility>

#include "tardelli/ops/factory.h"
#include "tardelli/ops/norm.h"

namespace td::nn {

namespace {

void check_shape(const Shape& s, const char* who) {
  TD_CHECK(!s.empty(), who, ": normalized_shape must have at least one dim");
  for (int64_t d : s) {
    TD_CHECK(d > 0, who, ": normalized_shape must be positive, got ", shape_str(s));
  }
}

// torch.finfo(dtype).eps, torch.nn.RMSNorm's default.
double machine_eps(DType dt) {
  switch (dt) {
    case DType::BFloat16:
      return 0x1.0p-7;
    case DType::Float16:
      return 0x1.0p-10;
    default:
      return 0x1.0p-23;
  }
}

}  // namespace

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias)
    : UnaryModule("LayerNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  check_shape(normalized_shape_, "LayerNorm");
  TD_CHECK(eps >= 0, "LayerNorm: eps must be >= 0, got ", eps);
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape_));
    if (bias) this->bias = register_parameter("bias", zeros(normalized_shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, normalized_shape_, weight, bias, eps_);
}

RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine)
    : UnaryModule("RMSNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  check_shape(normalized_shape_, "RMSNorm");
  TD_CHECK(!eps || *eps >= 0, "RMSNorm: eps must be >= 0, got ", eps.value_or(0));
  if (elementwise_affine) weight = register_parameter("weight", ones(normalized_shape_));
}

Tensor RMSNorm::forward(const Tensor& x) {
  TD_CHECK(x.defined(), "RMSNorm.forward: input is an undefined tensor");
  return rms_norm(x, normalized_shape_, weight, eps_ ? *eps_ : machine_eps(x.dtype()));
}

}  // namespace td::nn
