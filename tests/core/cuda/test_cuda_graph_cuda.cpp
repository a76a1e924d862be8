// td::CudaGraph (include/tardelli/core/cuda_graph.h, Note [CUDA graphs]) on a GPU; skips without
// one.
//
// Properties: a captured sequence of ops (linear, GELU, layer norm, an autograd backward, a
// whole training step with the capturable AdamW)
// replayed after new data is copied into its static input gives exactly the eager result on that
// data (the same kernels with the same algorithms: bitwise); memory allocated after the capture
// never aliases the graph's (Note [Graph memory pools]: replays leave such tensors untouched);
// a capture that waits for the device (item()) fails with CUDA's reason and leaves the thread's
// stream usable; misuse (replay before capture, capture twice) is a td::Error.
#include <gtest/gtest.h>

#include <string>

#include "ops/cuda/cuda_test_util.h"
#include "tardelli/autograd/engine.h"
#include "tardelli/core/cuda_graph.h"

namespace td {
namespace {

using test::gpu;
using test::randn_seeded;
using test::same_bytes;

struct Net {
  Tensor w, b, gamma, beta;
  Net()
      : w(randn_seeded({96, 64}, 1, 0.1).to(gpu())),
        b(randn_seeded({96}, 2, 0.1).to(gpu())),
        gamma(randn_seeded({96}, 3, 0.1, 1.0).to(gpu())),
        beta(randn_seeded({96}, 4, 0.1).to(gpu())) {}
  Tensor operator()(const Tensor& x) const {
    return layer_norm(gelu(linear(x, w, b), GeluApprox::Tanh), {96}, gamma, beta);
  }
};

TEST(CudaGraphCuda, ReplayEqualsEagerOnNewInputs) {
  TD_REQUIRE_CUDA();
  Net net;
  Tensor x = randn_seeded({128, 64}, 10).to(gpu());
  net(x);  // warm-up: plans and workspaces outside the capture
  CudaGraph g;
  g.capture_begin();
  Tensor y = net(x);
  g.capture_end();
  ASSERT_TRUE(g.ready());
  for (uint64_t seed : {11, 12, 13}) {
    const Tensor fresh = randn_seeded({128, 64}, seed);
    x.copy_(fresh.to(gpu()));
    g.replay();
    const Tensor eager = net(fresh.to(gpu()));
    EXPECT_TRUE(same_bytes(y.to(kCPU), eager.to(kCPU))) << "seed " << seed;
  }
}

TEST(CudaGraphCuda, CapturedBackwardAndNoAliasingAfterCapture) {
  TD_REQUIRE_CUDA();
  Net net;
  Tensor x = randn_seeded({128, 64}, 20).to(gpu());
  Tensor w = net.w.detach();
  w.set_requires_grad(true);
  net.w = w;
  auto step = [&] {
    Tensor loss = sum(mul(net(x), net(x)));
    return autograd::grad({loss}, {w}, {})[0];
  };
  step();  // warm-up
  CudaGraph g;
  g.capture_begin();
  Tensor dw = step();
  g.capture_end();
  // Tensors made after the capture, filled with a pattern: replays must not touch them.
  Tensor guard = full({1 << 20}, 7.0, {DType::Float32, gpu()});
  for (uint64_t seed : {21, 22}) {
    const Tensor fresh = randn_seeded({128, 64}, seed);
    x.copy_(fresh.to(gpu()));
    g.replay();
    Tensor want = step();
    EXPECT_TRUE(same_bytes(dw.to(kCPU), want.to(kCPU))) << "seed " << seed;
  }
  EXPECT_EQ(max(abs(sub(guard, 7.0))).item_double(), 0.0);
}

// A whole training step (gradients zeroed in place, forward, backward, the capturable AdamW
// of Note [Capturable AdamW]) captured after one eager step and replayed equals the same steps
// run eagerly from the same start, bitwise: the step count and learning rate come from device
// tensors, so each replay is the next step (and a learning-rate change between replays counts).
TEST(CudaGraphCuda, WholeTrainingStepWithCapturableAdamW) {
  TD_REQUIRE_CUDA();
  struct Trainer {
    Net net;
    Tensor x = randn_seeded({128, 64}, 40).to(gpu());
    Tensor m = zeros({96, 64}, {DType::Float32, gpu()}),
           v = zeros({96, 64}, {DType::Float32, gpu()});
    Tensor lr = full({}, 1e-2, {DType::Float32, gpu()}), step = zeros({}, {DType::Float32, gpu()});
    Trainer() {
      Tensor w = net.w.detach().clone();
      w.set_requires_grad(true);
      net.w = w;
    }
    void run() {
      Tensor g = net.w.grad();
      if (g.defined()) g.fill_(0.0);
      autograd::backward({sum(mul(net(x), net(x)))}, {}, false, false);
      TensorList ps = {net.w}, gs = {net.w.grad()}, ms = {m}, vs = {v};
      adamw_step_capturable(ps, gs, ms, vs, lr, step, 0.9, 0.95, 1e-8, 0.1);
    }
  };
  Trainer eager, graphed;
  eager.run();
  graphed.run();  // warm-up: gradients, descriptor cache, plans
  CudaGraph g;
  g.capture_begin();
  graphed.run();
  g.capture_end();
  // The capture recorded the step without running it: graphed is one step behind.
  for (int k = 0; k < 4; ++k) {
    if (k == 2) {
      eager.lr.fill_(3e-3);
      graphed.lr.fill_(3e-3);
    }
    eager.run();
    g.replay();
    EXPECT_TRUE(same_bytes(graphed.net.w.to(kCPU), eager.net.w.to(kCPU))) << "step " << k + 2;
  }
  EXPECT_EQ(graphed.step.item_double(), eager.step.item_double());
}

TEST(CudaGraphCuda, HostWaitInCaptureFailsAndStreamIsRestored) {
  TD_REQUIRE_CUDA();
  Tensor x = randn_seeded({16}, 30).to(gpu());
  CudaGraph g;
  g.capture_begin();
  Tensor y = mul(x, 2.0);
  std::string msg;
  try {
    (void)y.item_double();  // waits for the device: not capturable
  } catch (const Error& e) {
    msg = e.what();
  }
  std::string end_msg = test::error_of([&] { g.capture_end(); });
  EXPECT_FALSE(msg.empty() && end_msg.empty()) << "a host wait inside a capture went unnoticed";
  if (!end_msg.empty()) {
    EXPECT_NE(end_msg.find("capture failed"), std::string::npos) << end_msg;
  }
  EXPECT_FALSE(g.ready());
  // The thread's stream is the eager one again.
  EXPECT_TRUE(same_bytes(mul(x, 3.0).to(kCPU), mul(x.to(kCPU), 3.0)));
}

TEST(CudaGraphCuda, Misuse) {
  TD_REQUIRE_CUDA();
  CudaGraph g;
  EXPECT_THROW(g.replay(), Error);
  EXPECT_THROW(g.capture_end(), Error);
  g.capture_begin();
  EXPECT_THROW(g.capture_begin(), Error);
  g.capture_end();  // an empty capture is a valid graph
  EXPECT_THROW(g.capture_begin(), Error);
  g.replay();
  EXPECT_THROW(CudaGraph{cuda_device_count()}, Error);
}

}  // namespace
}  // namespace td
