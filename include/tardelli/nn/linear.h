#pragma once
// td::nn::UnaryModule (the one-tensor-in, one-tensor-out interface Sequential composes) and
// td::nn::Linear (torch.nn.Linear).
#include <cstdint>

#include "tardelli/core/rng.h"
#include "tardelli/nn/module.h"

namespace td::nn {

// A module whose forward maps one tensor to one tensor. Modules are held by std::shared_ptr
// (create them with std::make_shared): Module::named_modules needs shared_from_this.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

// y = x W^T + b with W [out_features, in_features], b [out_features] (td::linear: one GEMM
// with fused bias). Initialization as torch: W and b ~ U(-1/sqrt(in), 1/sqrt(in)) (torch's
// kaiming_uniform_(a=sqrt(5)) reduces to this bound), drawn from `gen` (the default generator
// when null), weight first, then bias.
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;

  // Makes this layer use `w` as its weight (weight tying, e.g. lm_head <- wte). The tensor is
  // shared, not copied; its shape must be [out_features, in_features].
  void tie_weight(const Tensor& w);

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return bias.defined(); }

  Tensor weight;
  Tensor bias;  // undefined when bias=false

 private:
  int64_t in_features_, out_features_;
};

}  // namespace td::nn
