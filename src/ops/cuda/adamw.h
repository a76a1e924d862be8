#pragma once
// CUDA side of the fused optimizer updates (src/ops/adamw.cpp, src/optim/sgd.cpp) and of the
// gradient norm of clip_grad_norm_ (src/optim/clip_grad.cpp); internal.
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

// The per-step scalars of Note [AdamW order of operations], formed by the front-end.
struct AdamWScalars {
  float decay, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps;
};
// In place; every tensor on a CUDA device, each group (param, grad, exp_avg, exp_avg_sq) on one
// device, contiguous, dtypes and sizes already checked. One launch per (device, param dtype,
// grad dtype) present in the lists.
void adamw_step(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                const TensorList& exp_avg_sqs, const AdamWScalars& c);
// The same with the 7 coefficients (AdamWScalars' order) in a float32 device tensor, and no
// host-to-device copy after the first call for a given set of tensors (Note [Capturable AdamW]).
void adamw_step_device_coeffs(const TensorList& params, const TensorList& grads,
                              const TensorList& exp_avgs, const TensorList& exp_avg_sqs,
                              const Tensor& coeffs);

struct SGDScalars {
  float lr, weight_decay, momentum, one_minus_dampening;
  bool nesterov;
};
// In place, as src/optim/sgd.cpp's loop: bufs[k] undefined means no momentum for tensor k;
// first[k]: its momentum buffer is initialized from this step's direction. Contiguous tensors,
// grads of the param's dtype or float32, buffers float32, all of group k on one CUDA device.
void sgd_step(const TensorList& params, const TensorList& grads, const TensorList& bufs,
              const std::vector<bool>& first, const SGDScalars& c);

// Partial norms of contiguous floating CUDA tensors, one value per chunk, in list order:
// kind 1: sum |x|, 2: sum x^2, 0: max |x| (NaN wins), 3: sum |x|^p. Each partial is reduced in
// double in a fixed order; combining them in the returned order is deterministic.
std::vector<double> grad_norm_partials(const TensorList& grads, int kind, double p);

}  // namespace td::cuda_ops
