#pragma once
// Learning-rate schedules: pure functions of the step, and a small scheduler that writes them
// into an optimizer's groups.
//
// The formulas are Megatron-LM's OptimizerParamScheduler.get_lr with init_lr = 0 (identical to
// nanoGPT's get_lr with `lr * it / warmup_iters` warmup). `step` counts optimizer steps already
// taken (0 for the first update), W = warmup steps, D = total (decay) steps:
//   step <= W (and W > 0):  lr = max_lr * step / W
//   step >  D:              lr = min_lr
//   otherwise, r = (step - W) / (D - W):
//     cosine:   lr = min_lr + 0.5 * (1 + cos(pi * r)) * (max_lr - min_lr)
//     linear:   lr = min_lr + (1 - r) * (max_lr - min_lr)
//     constant: lr = max_lr (for every step > W; D is not used)
// So step 0 has lr 0 when there is warmup (Megatron), max_lr is reached at step W, and the
// decay ends at min_lr exactly at step D. Bad arguments (negative steps, D < W, min_lr > max_lr,
// negative rates) are a td::Error.
#include <cstdint>
#include <string>
#include <vector>

#include "tardelli/optim/optimizer.h"

namespace td::optim {

double warmup_cosine(int64_t step, int64_t warmup, int64_t total, double max_lr,
                     double min_lr = 0.0);
double warmup_linear(int64_t step, int64_t warmup, int64_t total, double max_lr,
                     double min_lr = 0.0);
double warmup_constant(int64_t step, int64_t warmup, double max_lr);

enum class DecayStyle { Cosine, Linear, Constant };
DecayStyle parse_decay_style(const std::string& s);  // "cosine" | "linear" | "constant"

struct LRScheduleConfig {
  double max_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // the step at which decay ends (total steps); unused for constant
  DecayStyle style = DecayStyle::Cosine;
};

// The schedule's lr at `step` (dispatches to the functions above).
double lr_at(const LRScheduleConfig& cfg, int64_t step);

// Sets each group's lr to lr_at(step) * lr_mult[g] (lr_mult defaults to 1 per group, like
// Megatron's per-group lr_mult). Construction applies step 0; call step() after each
// optimizer.step(). The optimizer must outlive the scheduler.
class LRScheduler {
 public:
  LRScheduler(Optimizer& optimizer, LRScheduleConfig cfg, std::vector<double> lr_mult = {});
  void step();                  // advances one step and applies it
  void set_step(int64_t step);  // jumps to `step` (resuming from a checkpoint) and applies it
  int64_t last_step() const { return step_; }
  double lr() const { return lr_at(cfg_, step_); }
  const LRScheduleConfig& config() const { return cfg_; }

 private:
  void apply();
  Optimizer& opt_;
  LRScheduleConfig cfg_;
  std::vector<double> lr_mult_;
  int64_t step_ = 0;
};

}  // namespace td::optim
