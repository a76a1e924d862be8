#pragma once
// td::optim::DynamicLossScaler: dynamic loss scaling for float16 training with fp32 master
// weights (torch.cuda.amp.GradScaler's rules; Megatron's DynamicGradScaler without hysteresis).
//
// float16 has 5 exponent bits: gradients below ~6e-8 flush to zero and above 65504 overflow. The
// loss is multiplied by scale() before backward, so the small gradients of the fp16 activations
// stay representable; the fp32 master gradients are then multiplied by 1 / scale() before the
// update. When a step's gradients hold inf or nan anywhere (on any rank), the step is skipped and
// the scale backs off; after growth_interval applied steps in a row it grows again.
//
// The train loop (td::train::Trainer, examples/train_gpt.cpp):
//   (loss * scaler.scale()).backward();            // (divided by the micro-batch count too)
//   double norm = grad_norm(...);                  // of the SCALED gradients, over all ranks
//   if (scaler.update(!std::isfinite(norm))) {     // every rank sees the same norm: agreement
//     scale every gradient by unscale_clip_factor(norm, scale_used, max_norm); optimizer.step();
//   }                                              // else: no update, gradients discarded
//
// Note [Overflow from the norm]: the total norm is a sum of squares in double of fp32 values, so
// it is finite exactly when every gradient element is finite (fp32 squares cannot overflow a
// double), and the trainers already all-reduce it over data, tensor and pipeline parallel ranks
// for clipping. Testing it therefore decides "found inf" identically on every rank with no
// collective of its own.
#include <cstdint>

namespace td::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;     // 2^16 (torch's default)
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // applied steps in a row before the scale grows
};

// What a checkpoint stores (meta.json "loss_scaler"): resuming with it continues bitwise.
struct LossScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;  // applied steps since the last overflow or growth
  int64_t skipped_steps = 0;   // steps skipped for inf/nan gradients since the run began
};

class DynamicLossScaler {
 public:
  // td::Error naming the option when it is out of range.
  explicit DynamicLossScaler(LossScalerOptions options = {});

  // The factor the loss is multiplied by before backward (a float32 value, as torch keeps it).
  double scale() const { return state_.scale; }
  // Records one step: found_inf (agreed by all ranks) skips it and multiplies the scale by
  // backoff_factor; otherwise the growth count advances and, at growth_interval, the scale is
  // multiplied by growth_factor. Returns whether the step's update is to be applied.
  bool update(bool found_inf);

  const LossScalerOptions& options() const { return options_; }
  const LossScalerState& state() const { return state_; }
  // td::Error when the state is not one this scaler could reach (scale <= 0 or non-finite,
  // negative counts).
  void load_state(const LossScalerState& state);

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

// The one factor that turns gradients of a loss scaled by `scale` into the unscaled gradients
// clipped to max_norm (torch's rule: x min(1, max_norm / (norm + 1e-6)), norm the unscaled total
// norm): (1 / scale) x clip coefficient. `scaled_norm` is the total norm of the scaled
// gradients; max_norm <= 0 or inf means no clipping. td::Error for a non-finite scaled_norm (that
// step must be skipped, not unscaled) or scale <= 0.
double unscale_clip_factor(double scaled_norm, double scale, double max_norm);

}  // namespace td::optim
