#include "tardelli/optim/loss_scaler.h"

#include <cmath>

#include "tardelli/core/error.h"

namespace td::optim {

namespace {

// Note [Float32 scale]: torch keeps the scale in a float32 tensor, so every product is rounded
// to float32; doing the same keeps the training loop and td.amp.GradScaler in step.
double as_f32(double v) {
  return static_cast<double>(static_cast<float>(v));
}

}  // namespace

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options) : options_(options) {
  TD_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0,
           "DynamicLossScaler: init_scale must be a positive finite number, got ",
           options.init_scale);
  TD_CHECK(options.growth_factor > 1.0, "DynamicLossScaler: growth_factor must be > 1, got ",
           options.growth_factor);
  TD_CHECK(options.backoff_factor > 0.0 && options.backoff_factor < 1.0,
           "DynamicLossScaler: backoff_factor must be in (0, 1), got ", options.backoff_factor);
  TD_CHECK(options.growth_interval >= 1, "DynamicLossScaler: growth_interval must be >= 1, got ",
           options.growth_interval);
  state_.scale = as_f32(options.init_scale);
}

bool DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    state_.scale = as_f32(state_.scale * options_.backoff_factor);
    state_.growth_tracker = 0;
    ++state_.skipped_steps;
    return false;
  }
  if (++state_.growth_tracker == options_.growth_interval) {
    const double grown = as_f32(state_.scale * options_.growth_factor);
    // torch keeps the old scale when growing would overflow float32.
    if (std::isfinite(grown)) state_.scale = grown;
    state_.growth_tracker = 0;
  }
  return true;
}

void DynamicLossScaler::load_state(const LossScalerState& state) {
  TD_CHECK(std::isfinite(state.scale) && state.scale > 0,
           "DynamicLossScaler.load_state: the scale must be a positive finite number, got ",
           state.scale);
  TD_CHECK(state.growth_tracker >= 0 && state.skipped_steps >= 0,
           "DynamicLossScaler.load_state: negative counts (growth_tracker ", state.growth_tracker,
           ", skipped_steps ", state.skipped_steps, ")");
  state_ = state;
  state_.scale = as_f32(state.scale);
}

double unscale_clip_factor(double scaled_norm, double scale, double max_norm) {
  TD_CHECK(std::isfinite(scaled_norm), "unscale_clip_factor: the gradient norm is ", scaled_norm,
           "; a step with inf/nan gradients is skipped, not unscaled");
  TD_CHECK(std::isfinite(scale) && scale > 0, "unscale_clip_factor: the scale must be > 0, got ",
           scale);
  const double inv = as_f32(1.0 / as_f32(scale));
  if (!(max_norm > 0) || std::isinf(max_norm)) return inv;
  const double norm = scaled_norm * inv;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? inv * coef : inv;
}

}  // namespace td::optim
