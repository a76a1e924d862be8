#include "tardelli/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

namespace td::optim {

namespace {

void check_common(const char* who, int64_t step, int64_t warmup, double max_lr) {
  TD_CHECK(step >= 0, who, ": step must be >= 0, got ", step);
  TD_CHECK(warmup >= 0, who, ": warmup must be >= 0, got ", warmup);
  TD_CHECK(max_lr >= 0, who, ": max_lr must be >= 0, got ", max_lr);
}

// The shared Megatron formula (lr_schedule.h); `linear` picks the decay shape.
double warmup_decay(const char* who, int64_t step, int64_t warmup, int64_t total, double max_lr,
                    double min_lr, bool linear) {
  check_common(who, step, warmup, max_lr);
  TD_CHECK(total >= warmup, who, ": total steps (", total, ") must be >= warmup steps (", warmup,
           ")");
  TD_CHECK(min_lr >= 0 && min_lr <= max_lr, who, ": need 0 <= min_lr <= max_lr, got min_lr ",
           min_lr, ", max_lr ", max_lr);
  if (warmup > 0 && step <= warmup) {
    return max_lr * static_cast<double>(step) / static_cast<double>(warmup);
  }
  if (step > total) return min_lr;
  const double ratio =
      static_cast<double>(step - warmup) / static_cast<double>(total - warmup);  // total > warmup
  const double coeff = linear ? 1.0 - ratio : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace

double warmup_cosine(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr) {
  return warmup_decay("warmup_cosine", step, warmup, total, max_lr, min_lr, false);
}

double warmup_linear(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr) {
  return warmup_decay("warmup_linear", step, warmup, total, max_lr, min_lr, true);
}

double warmup_constant(int64_t step, int64_t warmup, double max_lr) {
  check_common("warmup_constant", step, warmup, max_lr);
  if (warmup > 0 && step <= warmup) {
    return max_lr * static_cast<double>(step) / static_cast<double>(warmup);
  }
  return max_lr;
}

DecayStyle parse_decay_style(const std::string& s) {
  if (s == "cosine") return DecayStyle::Cosine;
  if (s == "linear") return DecayStyle::Linear;
  if (s == "constant") return DecayStyle::Constant;
  TD_ERROR("lr schedule: unknown decay style '", s, "' (expected cosine, linear or constant)");
}

double lr_at(const LRScheduleConfig& cfg, int64_t step) {
  switch (cfg.style) {
    case DecayStyle::Cosine:
      return warmup_cosine(step, cfg.warmup_steps, cfg.decay_steps, cfg.max_lr, cfg.min_lr);
    case DecayStyle::Linear:
      return warmup_linear(step, cfg.warmup_steps, cfg.decay_steps, cfg.max_lr, cfg.min_lr);
    case DecayStyle::Constant:
      return warmup_constant(step, cfg.warmup_steps, cfg.max_lr);
  }
  TD_ERROR("lr schedule: invalid decay style");
}

LRScheduler::LRScheduler(Optimizer& optimizer, LRScheduleConfig cfg, std::vector<double> lr_mult)
    : opt_(optimizer), cfg_(cfg), lr_mult_(std::move(lr_mult)) {
  const size_t n = opt_.param_groups().size();
  if (lr_mult_.empty()) lr_mult_.assign(n, 1.0);
  TD_CHECK(lr_mult_.size() == n, "LRScheduler: ", lr_mult_.size(), " lr multipliers for ", n,
           " parameter groups");
  for (double m : lr_mult_) TD_CHECK(m >= 0, "LRScheduler: lr_mult must be >= 0, got ", m);
  lr_at(cfg_, 0);  // validates the configuration
  apply();
}

void LRScheduler::step() {
  ++step_;
  apply();
}

void LRScheduler::set_step(int64_t step) {
  TD_CHECK(step >= 0, "LRScheduler.set_step: step must be >= 0, got ", step);
  step_ = step;
  apply();
}

void LRScheduler::apply() {
  auto& groups = opt_.param_groups();
  TD_CHECK(groups.size() == lr_mult_.size(), "LRScheduler: the optimizer now has ", groups.size(),
           " parameter groups, the scheduler was built for ", lr_mult_.size());
  const double lr = lr_at(cfg_, step_);
  for (size_t g = 0; g < groups.size(); ++g) groups[g].lr = lr * lr_mult_[g];
}

}  // namespace td::optim
