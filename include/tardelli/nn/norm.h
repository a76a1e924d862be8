#pragma once
// td::nn::LayerNorm and td::nn::RMSNorm (torch.nn.LayerNorm / torch.nn.RMSNorm) over the
// trailing `normalized_shape` dims, through the fused td::layer_norm / td::rms_norm kernels.
#include <optional>

#include "tardelli/nn/linear.h"

namespace td::nn {

// y = (x - mean) / sqrt(var + eps) * weight + bias; weight = 1, bias = 0 initially.
// elementwise_affine=false: no weight and no bias; bias=false: weight only.
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true)
      : LayerNorm(Shape{dim}, eps, elementwise_affine, bias) {}
  Tensor forward(const Tensor& x) override;

  const Shape& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }

  Tensor weight;  // undefined when elementwise_affine=false
  Tensor bias;    // undefined when elementwise_affine=false or bias=false

 private:
  Shape normalized_shape_;
  double eps_;
};

// y = x / sqrt(mean(x^2) + eps) * weight; weight = 1 initially. eps unset means torch's rule:
// the machine epsilon of the input's dtype (fp32 2^-23, bf16 2^-7, f16 2^-10).
class RMSNorm : public UnaryModule {
 public:
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true);
  explicit RMSNorm(int64_t dim, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true)
      : RMSNorm(Shape{dim}, eps, elementwise_affine) {}
  Tensor forward(const Tensor& x) override;

  const Shape& normalized_shape() const { return normalized_shape_; }
  std::optional<double> eps() const { return eps_; }

  Tensor weight;  // undefined when elementwise_affine=false

 private:
  Shape normalized_shape_;
  std::optional<double> eps_;
};

}  // namespace td::nn
