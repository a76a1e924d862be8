// td::optim::AdamW against torch.optim.AdamW's update rule written out in double.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "tardelli/nn/nn.h"
#include "tardelli/optim/adamw.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using namespace td::test;

namespace {

// torch.optim.AdamW (amsgrad=False) for one parameter, in double. `step` is per parameter.
struct RefAdamW {
  double lr, b1, b2, eps, wd;
  std::vector<double> m, v;
  int64_t step = 0;
  void update(std::vector<double>& p, const std::vector<double>& g) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++step;
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

}  // namespace

// Five steps, two groups with different lr / weight decay / betas, and a parameter that has no
// gradient on the first step (so its bias correction runs one step behind, as torch's per-
// parameter step does). Parameters and moments match the double reference: each step is a few
// fp32 operations on O(1) values, so 1e-6 absolute over five steps (the updates are O(lr) =
// 1e-2, far above it); state_dict reports the per-parameter step counts.
TEST(OptimAdamW, FiveStepsMatchTorchFormula) {
  Tensor a = leaf({40000}, 1), b = leaf({7, 3}, 2), c = leaf({5}, 3);
  std::vector<double> pa = doubles(a), pb = doubles(b), pc = doubles(c);
  RefAdamW ra{1e-2, 0.9, 0.999, 1e-8, 0.1, {}, {}}, rb = ra, rc{2e-2, 0.8, 0.99, 1e-6, 0.0, {}, {}};
  optim::AdamWOptions defaults;
  defaults.lr = 1e-2;
  defaults.weight_decay = 0.1;
  optim::AdamW opt(
      std::vector<optim::ParamGroup>{
          optim::ParamGroup({a, b}),
          optim::ParamGroup({c}, 2e-2, 0.0, {{"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}})},
      defaults);
  EXPECT_EQ(*opt.param_groups()[0].lr, 1e-2);
  EXPECT_EQ(opt.param_groups()[0].option("beta2"), 0.999);
  for (int s = 0; s < 5; ++s) {
    Generator gen(100 + s);
    a.set_grad(mul(randn({40000}, {}, &gen), 0.1));
    c.set_grad(randn({5}, {}, &gen));
    ra.update(pa, doubles(a.grad()));
    rc.update(pc, doubles(c.grad()));
    if (s > 0) {
      b.set_grad(randn({7, 3}, {}, &gen));
      rb.update(pb, doubles(b.grad()));
    }
    opt.step();
  }
  expect_close(doubles(a), pa, 1e-6, 1e-6, "a");
  expect_close(doubles(b), pb, 1e-6, 1e-6, "b");
  expect_close(doubles(c), pc, 1e-6, 1e-6, "c");
  auto sd = opt.state_dict();
  EXPECT_EQ(sd.state.at(0).step, 5);
  EXPECT_EQ(sd.state.at(1).step, 4);
  EXPECT_EQ(sd.state.at(2).step, 5);
  expect_close(doubles(sd.state.at(0).tensors.at("exp_avg")), ra.m, 1e-8, 1e-5, "exp_avg");
  expect_close(doubles(sd.state.at(2).tensors.at("exp_avg_sq")), rc.v, 1e-10, 1e-5, "exp_avg_sq");
  ASSERT_EQ(sd.groups.size(), 2u);
  EXPECT_EQ(sd.groups[1].params, (std::vector<int64_t>{2}));
  EXPECT_EQ(sd.groups[1].options.at("beta1"), 0.8);
}

// Gradient accumulation: two backward passes without zero_grad in between leave the sum of the
// two gradients, so one step equals the step taken with the gradient of the summed loss.
TEST(OptimAdamW, GradientAccumulation) {
  Generator g1(5), g2(5);
  nn::Linear l1(6, 3, true, &g1), l2(6, 3, true, &g2);
  Tensor x1 = randn({4, 6}), x2 = randn({4, 6});
  optim::AdamW o1(l1.parameters()), o2(l2.parameters());
  sum(l1(x1)).backward();
  sum(l1(x2)).backward();
  add(sum(l2(x1)), sum(l2(x2))).backward();
  expect_close(doubles(l1.weight.grad()), doubles(l2.weight.grad()), 1e-6, 1e-6, "grad");
  o1.step();
  o2.step();
  expect_close(doubles(l1.weight), doubles(l2.weight), 1e-6, 1e-6, "weight");
  o1.zero_grad(false);
  EXPECT_EQ(to_vector<float>(l1.bias.grad()), std::vector<float>(3, 0.0f));
  o1.zero_grad();
  EXPECT_FALSE(l1.bias.grad().defined());
}

// Save after 3 steps, load into a fresh optimizer over copies of the parameters, then 2 more
// identical steps on both: bitwise equal parameters (state and step counts fully restored,
// hyperparameters included). Loading copies, so the dict does not alias the new optimizer.
TEST(OptimAdamW, StateDictRoundTrip) {
  Tensor p = leaf({100}, 1), q = leaf({4, 4}, 2);
  optim::AdamWOptions o;
  o.lr = 0.05;
  optim::AdamW a({p, q}, o);
  auto grads = [](int s) {
    Generator gen(50 + s);
    return std::make_pair(randn({100}, {}, &gen), randn({4, 4}, {}, &gen));
  };
  for (int s = 0; s < 3; ++s) {
    auto [gp, gq] = grads(s);
    p.set_grad(gp);
    q.set_grad(gq);
    a.step();
  }
  Tensor p2 = p.detach().clone(), q2 = q.detach().clone();
  p2.set_requires_grad(true);
  q2.set_requires_grad(true);
  optim::AdamW b({p2, q2});  // default lr 1e-3: the loaded groups restore 0.05
  auto sd = a.state_dict();
  b.load_state_dict(sd);
  EXPECT_EQ(*b.param_groups()[0].lr, 0.05);
  EXPECT_FALSE(b.state_dict().state.at(0).tensors.at("exp_avg").shares_storage(
      sd.state.at(0).tensors.at("exp_avg")));
  for (int s = 3; s < 5; ++s) {
    auto [gp, gq] = grads(s);
    p.set_grad(gp);
    q.set_grad(gq);
    p2.set_grad(gp);
    q2.set_grad(gq);
    a.step();
    b.step();
  }
  EXPECT_EQ(to_vector<float>(p), to_vector<float>(p2));
  EXPECT_EQ(to_vector<float>(q), to_vector<float>(q2));
}

// load_state_dict rejects a layout that does not fit (group count, group size, tensor shape,
// unknown state names) and leaves the optimizer unchanged when it does.
TEST(OptimAdamW, LoadStateDictErrors) {
  Tensor p = leaf({10}, 1), q = leaf({3}, 2);
  optim::AdamW a({p, q});
  p.set_grad(ones({10}));
  q.set_grad(ones({3}));
  a.step();
  auto good = a.state_dict();
  auto bad_shape = good;
  bad_shape.state.at(1).tensors["exp_avg"] = zeros({4});
  try {
    a.load_state_dict(bad_shape);
    ADD_FAILURE() << "no error for a shape mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[4]"), std::string::npos) << e.what();
  }
  auto bad_groups = good;
  bad_groups.groups.push_back(bad_groups.groups[0]);
  EXPECT_THROW(a.load_state_dict(bad_groups), Error);
  auto bad_size = good;
  bad_size.groups[0].params.pop_back();
  EXPECT_THROW(a.load_state_dict(bad_size), Error);
  auto bad_name = good;
  bad_name.state.at(0).tensors["momentum_buffer"] = zeros({10});
  EXPECT_THROW(a.load_state_dict(bad_name), Error);
  auto bad_index = good;
  bad_index.state[7] = bad_index.state.at(0);
  EXPECT_THROW(a.load_state_dict(bad_index), Error);
  // Unchanged: still step 1 with the moments of one step of g = 1 (m = 0.1).
  auto now = a.state_dict();
  EXPECT_EQ(now.state.at(1).step, 1);
  EXPECT_NEAR(doubles(now.state.at(1).tensors.at("exp_avg"))[0], 0.1, 1e-7);
}

// bf16 parameters with fp32 state: each step is computed in fp32 and rounded to bf16 once, the
// reference in double and rounded the same way. Where the exact value lies within fp32 rounding of
// a bf16 rounding midpoint the two may round to neighbours: one bf16 ulp apart, which is up to
// 2^-7 of the value (2^-8 was half an ulp for values just above a power of two, and failed for
// some data). Own generator: the data do not depend on which tests ran before.
TEST(OptimAdamW, BFloat16Parameters) {
  Generator gen(77);
  Tensor p = randn({500}, {}, &gen).to(DType::BFloat16);
  p.set_requires_grad(true);
  std::vector<double> ref = doubles(p);
  RefAdamW r{0.05, 0.9, 0.999, 1e-8, 0.01, {}, {}};
  optim::AdamWOptions o;
  o.lr = 0.05;
  optim::AdamW opt({p}, o);
  for (int s = 0; s < 3; ++s) {
    Tensor g = randn({500}, {}, &gen);  // fp32 gradients for bf16 parameters are accepted
    p.set_grad(g);
    opt.step();
    r.update(ref, doubles(g));
    for (double& x : ref) x = static_cast<float>(BFloat16(static_cast<float>(x)));
  }
  EXPECT_EQ(p.dtype(), DType::BFloat16);
  EXPECT_EQ(opt.state_dict().state.at(0).tensors.at("exp_avg").dtype(), DType::Float32);
  expect_close(doubles(p), ref, 1e-6, std::ldexp(1.0, -7), "bf16 p");
}

// torch's argument checks.
TEST(OptimAdamW, BadArguments) {
  Tensor p = leaf({3}, 1);
  EXPECT_THROW(optim::AdamW(TensorList{}), Error);
  optim::AdamWOptions neg;
  neg.lr = -1e-3;
  EXPECT_THROW(optim::AdamW({p}, neg), Error);
  optim::AdamWOptions beta;
  beta.beta1 = 1.0;
  EXPECT_THROW(optim::AdamW({p}, beta), Error);
  optim::AdamWOptions eps;
  eps.eps = -1;
  EXPECT_THROW(optim::AdamW({p}, eps), Error);
  EXPECT_THROW(optim::AdamW({p, p}), Error);
  EXPECT_THROW(optim::AdamW(std::vector<optim::ParamGroup>{
                   optim::ParamGroup({p}, std::nullopt, std::nullopt, {{"momentum", 0.9}})}),
               Error);
  optim::AdamW opt({p});
  Tensor other = leaf({2}, 2);
  EXPECT_THROW(opt.add_param_group(optim::ParamGroup({p})), Error);  // already present
  opt.add_param_group(optim::ParamGroup({other}, 0.5));
  EXPECT_EQ(opt.param_groups().size(), 2u);
  EXPECT_EQ(opt.param_groups()[1].option("eps"), 1e-8);
  EXPECT_THROW(opt.set_lr(-1), Error);
}
