#pragma once
// The fused AdamW update (Loshchilov & Hutter): one pass over param, grad and both moments.
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr * wd * p
// Moments are fp32; param and grad may be fp32, bf16 or f16 (computed in fp32).
#include "tardelli/core/tensor.h"

namespace td {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  int64_t step = 1;  // 1-based step count for bias correction
};

// In place on param, exp_avg and exp_avg_sq (all contiguous, same numel). Not recorded.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWConfig& cfg);
// Multi-tensor form: one parallel region over all tensors (fewer launches, better balance).
void adamw_step(TensorList& params, const TensorList& grads, TensorList& exp_avgs,
                TensorList& exp_avg_sqs, const AdamWConfig& cfg);
// The multi-tensor step for CUDA graphs (Note [Capturable AdamW] in src/ops/adamw.cpp): `lr`
// and `step` are 0-dim float32 tensors on the parameters' device (all parameters on one
// device); `step` is incremented by one, then the update uses it. Reads nothing back on a GPU;
// the first call for a given set of tensors waits for the device once (run it eagerly before
// capturing).
void adamw_step_capturable(TensorList& params, const TensorList& grads, TensorList& exp_avgs,
                           TensorList& exp_avg_sqs, const Tensor& lr, Tensor& step, double beta1,
                           double beta2, double eps, double weight_decay);

}  // namespace td
