// td::optim::SGD against torch.optim.SGD's update rule written out in double.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tardelli/optim/sgd.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// torch/optim/sgd.py (_single_tensor_sgd), in double, for one parameter.
struct RefSGD {
  double lr, momentum, dampening, wd;
  bool nesterov;
  std::vector<double> buf;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    std::vector<double> d = g;
    for (size_t i = 0; i < p.size(); ++i) {
      if (wd != 0) d[i] += wd * p[i];
    }
    if (momentum != 0) {
      if (buf.empty()) {
        buf = d;
      } else {
        for (size_t i = 0; i < p.size(); ++i) buf[i] = momentum * buf[i] + (1 - dampening) * d[i];
      }
      for (size_t i = 0; i < p.size(); ++i) d[i] = nesterov ? d[i] + momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * d[i];
  }
};

struct Case {
  const char* name;
  optim::SGDOptions opt;
};

}  // namespace

// Five steps with fresh gradients each step, for plain SGD, weight decay, momentum, momentum
// with dampening, and nesterov (+ weight decay): parameters and momentum buffers match the
// double reference. Each step is a handful of fp32 operations on O(1) values: 1e-6 absolute
// over five steps is ~10 ulp of headroom. The parameters move by O(lr) per step, far above it.
TEST(OptimSGD, MatchesTorchFormulaOverSteps) {
  const Case cases[] = {
      {"plain", {0.1, 0, 0, 0, false}},         {"weight_decay", {0.1, 0, 0, 0.05, false}},
      {"momentum", {0.05, 0.9, 0, 0, false}},   {"dampening", {0.05, 0.9, 0.3, 0.01, false}},
      {"nesterov", {0.05, 0.8, 0, 0.02, true}},
  };
  for (const Case& c : cases) {
    Tensor a = leaf({40000}, 1), b = leaf({3, 5}, 2);  // a spans several 16384-element chunks
    std::vector<double> pa = doubles(a), pb = doubles(b), pa0 = pa;
    RefSGD ra{c.opt.lr, c.opt.momentum, c.opt.dampening, c.opt.weight_decay, c.opt.nesterov, {}};
    RefSGD rb = ra;
    optim::SGD opt({a, b}, c.opt);
    for (int s = 0; s < 5; ++s) {
      Generator gen(100 + s);
      a.set_grad(randn({40000}, {}, &gen));
      b.set_grad(randn({3, 5}, {}, &gen));
      ra.step(pa, doubles(a.grad()));
      rb.step(pb, doubles(b.grad()));
      opt.step();
    }
    expect_close(doubles(a), pa, 1e-6, 1e-6, std::string(c.name) + " a");
    expect_close(doubles(b), pb, 1e-6, 1e-6, std::string(c.name) + " b");
    EXPECT_GT(std::fabs(doubles(a)[0] - pa0[0]), 1e-3) << c.name;
    auto sd = opt.state_dict();
    if (c.opt.momentum != 0) {
      ASSERT_TRUE(sd.state.count(0)) << c.name;
      expect_close(doubles(sd.state.at(0).tensors.at("momentum_buffer")), ra.buf, 1e-6, 1e-6,
                   std::string(c.name) + " buf");
    } else {
      EXPECT_TRUE(!sd.state.count(0) || sd.state.at(0).tensors.empty()) << c.name;
    }
  }
}

// A non-contiguous parameter (a transposed leaf over a larger storage) is updated in place:
// the storage it views changes exactly where the parameter lies.
TEST(OptimSGD, NonContiguousParameter) {
  Tensor base = randn({4, 6});
  Tensor p = base.t();  // [6, 4], strides (1, 6), a leaf
  p.set_requires_grad(true);
  ASSERT_FALSE(p.is_contiguous());
  std::vector<double> want = doubles(p);
  Tensor g = randn({6, 4});
  p.set_grad(g);
  optim::SGD opt({p}, {0.5});
  opt.step();
  std::vector<double> gv = doubles(g);
  for (size_t i = 0; i < want.size(); ++i) want[i] -= 0.5 * gv[i];
  expect_close(doubles(p), want, 1e-6, 1e-6, "p");
  expect_close(doubles(base.t()), want, 1e-6, 1e-6, "base");
}

// bf16 parameters with an fp32 momentum buffer: each step computed in fp32 and rounded to bf16
// once, as the reference does (rounding the double result: they can differ by one bf16 ulp,
// 2^-8 relative, when fp32 rounding lands on the other side of a tie).
TEST(OptimSGD, BFloat16Parameter) {
  Tensor p = randn({1000}).to(DType::BFloat16);
  p.set_requires_grad(true);
  std::vector<double> ref = doubles(p), buf;
  optim::SGD opt({p}, {0.1, 0.9});
  for (int s = 0; s < 3; ++s) {
    Tensor g = randn({1000}).to(DType::BFloat16);
    p.set_grad(g);
    opt.step();
    std::vector<double> gv = doubles(g);
    if (buf.empty()) {
      buf = gv;
    } else {
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = 0.9 * buf[i] + gv[i];
    }
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] = static_cast<float>(BFloat16(static_cast<float>(ref[i] - 0.1 * buf[i])));
    }
  }
  EXPECT_EQ(p.dtype(), DType::BFloat16);
  EXPECT_EQ(opt.state_dict().state.at(0).tensors.at("momentum_buffer").dtype(), DType::Float32);
  expect_close(doubles(p), ref, 1e-6, std::ldexp(1.0, -8), "bf16 p");
}

// torch's argument checks: empty parameter list, negative lr/momentum/weight decay, nesterov
// without momentum or with dampening, unknown group options, duplicate parameters.
TEST(OptimSGD, BadArguments) {
  Tensor p = leaf({3}, 1);
  EXPECT_THROW(optim::SGD(TensorList{}), Error);
  EXPECT_THROW(optim::SGD(std::vector<optim::ParamGroup>{}), Error);
  EXPECT_THROW(optim::SGD({p}, {-0.1}), Error);
  EXPECT_THROW(optim::SGD({p}, {0.1, -0.5}), Error);
  EXPECT_THROW(optim::SGD({p}, {0.1, 0, 0, -1}), Error);
  EXPECT_THROW(optim::SGD({p}, {0.1, 0, 0, 0, true}), Error);
  EXPECT_THROW(optim::SGD({p}, {0.1, 0.9, 0.1, 0, true}), Error);
  EXPECT_THROW(optim::SGD({p, p}), Error);
  EXPECT_THROW(optim::SGD(std::vector<optim::ParamGroup>{
                   optim::ParamGroup({p}, 0.1, std::nullopt, {{"betas", 0.9}})}),
               Error);
  Tensor ints = zeros({3}, {DType::Int64});
  EXPECT_THROW(optim::SGD({ints}), Error);
  Tensor nonleaf = mul(p, 2.0);
  EXPECT_THROW(optim::SGD({nonleaf}), Error);
  // A negative lr set later (by hand) is caught at step().
  optim::SGD opt({p}, {0.1});
  opt.param_groups()[0].lr = -1.0;
  p.set_grad(ones({3}));
  EXPECT_THROW(opt.step(), Error);
}
