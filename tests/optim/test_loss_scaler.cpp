// DynamicLossScaler: torch's GradScaler rules, float32 scale, state round trip, and the
// unscale-and-clip factor against unscaling then clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tardelli/optim/loss_scaler.h"
#include "tardelli/tardelli.h"

using namespace td;
using td::optim::DynamicLossScaler;
using td::optim::LossScalerOptions;
using td::optim::LossScalerState;

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  // Property: an overflow skips the step, halves the scale and restarts the growth count; the
  // scale doubles after exactly growth_interval applied steps in a row (torch's
  // _amp_update_scale_), and skipped steps are counted.
  DynamicLossScaler s({.init_scale = 1024.0, .growth_interval = 3});
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));  // overflow at the third step: skipped, no growth
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().skipped_steps, 1);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_TRUE(s.update(false));  // the third clean step in a row grows the scale
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.state().growth_tracker, 0);
}

TEST(LossScaler, ScaleIsAFloat32AndNeverGrowsToInfinity) {
  // Property: the scale is rounded to float32 after every change (so the C++ and Python
  // trainers agree bit for bit), and growth that would overflow float32 keeps the old scale.
  DynamicLossScaler s({.init_scale = 3.0e38, .growth_factor = 2.0, .growth_interval = 1});
  EXPECT_EQ(s.scale(), static_cast<double>(3.0e38f));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), static_cast<double>(3.0e38f));
  DynamicLossScaler t({.init_scale = 1.0, .backoff_factor = 0.1});
  t.update(true);
  EXPECT_EQ(t.scale(), static_cast<double>(0.1f));
}

TEST(LossScaler, StateRoundTripContinuesIdentically) {
  // Property: a scaler loaded with another's state makes the same decisions from then on.
  DynamicLossScaler a({.init_scale = 256.0, .growth_interval = 2});
  a.update(false);
  a.update(true);
  a.update(false);
  DynamicLossScaler b({.init_scale = 256.0, .growth_interval = 2});
  b.load_state(a.state());
  for (bool inf : {false, false, true, false, false, false}) {
    EXPECT_EQ(a.update(inf), b.update(inf));
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.state().growth_tracker, b.state().growth_tracker);
    EXPECT_EQ(a.state().skipped_steps, b.state().skipped_steps);
  }
}

TEST(LossScaler, BadOptionsAndStatesAreErrors) {
  EXPECT_THROW(DynamicLossScaler({.init_scale = 0.0}), Error);
  EXPECT_THROW(DynamicLossScaler({.growth_factor = 1.0}), Error);
  EXPECT_THROW(DynamicLossScaler({.backoff_factor = 1.0}), Error);
  EXPECT_THROW(DynamicLossScaler({.growth_interval = 0}), Error);
  DynamicLossScaler s;
  EXPECT_THROW(s.load_state({.scale = std::numeric_limits<double>::infinity()}), Error);
  EXPECT_THROW(s.load_state({.scale = 2.0, .growth_tracker = -1}), Error);
  EXPECT_THROW(optim::unscale_clip_factor(std::nan(""), 2.0, 1.0), Error);
}

TEST(LossScaler, UnscaleClipFactorEqualsUnscalingThenClipping) {
  // Property: multiplying the scaled gradients by the one factor gives what unscaling (x 1/s)
  // and then torch's clip (x max_norm / (norm + 1e-6) when below 1) give, to a few fp32 ulps
  // (one product of two factors instead of two roundings).
  Generator gen(7);
  const double s = 4096.0;
  Tensor g = mul(randn({1000}, {}, &gen), 3.0);  // norm about 95: clipped to 1
  Tensor scaled = mul(g, s);
  const double scaled_norm = std::sqrt(sum(mul(scaled, scaled)).item_double());
  for (double max_norm : {1.0, 1e6, 0.0}) {
    Tensor one = mul(scaled, optim::unscale_clip_factor(scaled_norm, s, max_norm));
    Tensor ref = mul(scaled, 1.0 / s);
    const double norm = std::sqrt(sum(mul(ref, ref)).item_double());
    if (max_norm > 0 && max_norm / (norm + 1e-6) < 1.0) ref = mul(ref, max_norm / (norm + 1e-6));
    const double err = max(abs(sub(one, ref))).item_double();
    const double mag = max(abs(ref)).item_double();
    EXPECT_LE(err, 4 * std::numeric_limits<float>::epsilon() * mag) << "max_norm " << max_norm;
  }
}
