// Learning-rate schedules: Megatron's get_lr formulas at the boundary steps, and the scheduler.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "tardelli/optim/adamw.h"
#include "tardelli/optim/lr_schedule.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::optim;

// Megatron-LM OptimizerParamScheduler.get_lr (init_lr = 0), written out independently.
static double megatron_lr(int64_t step, int64_t warmup, int64_t decay, double max_lr, double min_lr,
                          const char* style) {
  if (warmup > 0 && step <= warmup) return max_lr * double(step) / double(warmup);
  if (std::string(style) == "constant") return max_lr;
  if (step > decay) return min_lr;
  double ratio = double(step - warmup) / double(decay - warmup);
  double coeff = std::string(style) == "linear" ? 1.0 - ratio
                                                : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

// Boundary values: 0 at step 0, half way through warmup, max at the end of warmup, the cosine
// midpoint (max+min)/2, min exactly at the last decay step and after it; every step in
// [0, 120] equals the written-out formula to double rounding (1e-15 relative).
TEST(OptimLRSchedule, WarmupCosineBoundaries) {
  const double mx = 6e-4, mn = 6e-5;
  EXPECT_EQ(warmup_cosine(0, 10, 110, mx, mn), 0.0);
  EXPECT_DOUBLE_EQ(warmup_cosine(5, 10, 110, mx, mn), mx / 2);
  EXPECT_DOUBLE_EQ(warmup_cosine(10, 10, 110, mx, mn), mx);
  EXPECT_LT(warmup_cosine(11, 10, 110, mx, mn), mx);
  EXPECT_DOUBLE_EQ(warmup_cosine(60, 10, 110, mx, mn), (mx + mn) / 2);
  EXPECT_DOUBLE_EQ(warmup_cosine(110, 10, 110, mx, mn), mn);
  EXPECT_EQ(warmup_cosine(111, 10, 110, mx, mn), mn);
  EXPECT_EQ(warmup_cosine(10000, 10, 110, mx, mn), mn);
  for (int64_t s = 0; s <= 120; ++s) {
    EXPECT_NEAR(warmup_cosine(s, 10, 110, mx, mn), megatron_lr(s, 10, 110, mx, mn, "cosine"),
                1e-15 * mx)
        << s;
  }
  // No warmup: step 0 is already max_lr.
  EXPECT_EQ(warmup_cosine(0, 0, 100, mx, mn), mx);
}

// Linear decay: max at the end of warmup, the exact midpoint half way through decay, min at the
// end; constant: warmup then max forever.
TEST(OptimLRSchedule, LinearAndConstant) {
  EXPECT_EQ(warmup_linear(0, 4, 24, 1.0, 0.2), 0.0);
  EXPECT_DOUBLE_EQ(warmup_linear(1, 4, 24, 1.0, 0.2), 0.25);
  EXPECT_DOUBLE_EQ(warmup_linear(4, 4, 24, 1.0, 0.2), 1.0);
  EXPECT_DOUBLE_EQ(warmup_linear(14, 4, 24, 1.0, 0.2), 0.6);
  EXPECT_DOUBLE_EQ(warmup_linear(19, 4, 24, 1.0, 0.2), 0.4);
  EXPECT_DOUBLE_EQ(warmup_linear(24, 4, 24, 1.0, 0.2), 0.2);
  EXPECT_EQ(warmup_linear(25, 4, 24, 1.0, 0.2), 0.2);
  for (int64_t s = 0; s <= 30; ++s) {
    EXPECT_NEAR(warmup_linear(s, 4, 24, 1.0, 0.2), megatron_lr(s, 4, 24, 1.0, 0.2, "linear"), 1e-15)
        << s;
  }
  EXPECT_EQ(warmup_constant(0, 4, 3e-4), 0.0);
  EXPECT_DOUBLE_EQ(warmup_constant(2, 4, 3e-4), 1.5e-4);
  EXPECT_EQ(warmup_constant(4, 4, 3e-4), 3e-4);
  EXPECT_EQ(warmup_constant(1000000, 4, 3e-4), 3e-4);
  EXPECT_EQ(warmup_constant(0, 0, 3e-4), 3e-4);
  // warmup == total: warm up, then min_lr (no division by zero).
  EXPECT_EQ(warmup_cosine(5, 5, 5, 1.0, 0.1), 1.0);
  EXPECT_EQ(warmup_cosine(6, 5, 5, 1.0, 0.1), 0.1);
}

TEST(OptimLRSchedule, BadArguments) {
  EXPECT_THROW(warmup_cosine(-1, 10, 100, 1.0, 0.0), Error);
  EXPECT_THROW(warmup_cosine(0, -1, 100, 1.0, 0.0), Error);
  EXPECT_THROW(warmup_cosine(0, 10, 5, 1.0, 0.0), Error);
  EXPECT_THROW(warmup_cosine(0, 10, 100, 1.0, 2.0), Error);
  EXPECT_THROW(warmup_linear(0, 10, 100, -1.0, -2.0), Error);
  EXPECT_THROW(warmup_constant(0, 0, -1.0), Error);
  EXPECT_THROW(parse_decay_style("exponential"), Error);
  EXPECT_EQ(parse_decay_style("linear"), DecayStyle::Linear);
}

// The scheduler applies step 0 at construction, then each step() writes lr * lr_mult into every
// group; set_step jumps (resume); a wrong number of multipliers is an error.
TEST(OptimLRSchedule, SchedulerDrivesGroups) {
  Tensor a = zeros({2}), b = zeros({2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  AdamW opt(std::vector<ParamGroup>{ParamGroup({a}), ParamGroup({b})});
  LRScheduleConfig cfg{1e-3, 1e-4, 2, 10, DecayStyle::Cosine};
  LRScheduler sched(opt, cfg, {1.0, 0.5});
  EXPECT_EQ(*opt.param_groups()[0].lr, 0.0);
  sched.step();
  EXPECT_DOUBLE_EQ(*opt.param_groups()[0].lr, 5e-4);
  EXPECT_DOUBLE_EQ(*opt.param_groups()[1].lr, 2.5e-4);
  sched.step();
  EXPECT_DOUBLE_EQ(*opt.param_groups()[0].lr, 1e-3);
  sched.set_step(6);
  EXPECT_DOUBLE_EQ(*opt.param_groups()[0].lr, 5.5e-4);
  EXPECT_EQ(sched.last_step(), 6);
  EXPECT_DOUBLE_EQ(sched.lr(), 5.5e-4);
  EXPECT_THROW(LRScheduler(opt, cfg, {1.0}), Error);
  LRScheduleConfig bad = cfg;
  bad.decay_steps = 1;
  EXPECT_THROW(LRScheduler(opt, bad), Error);
}
