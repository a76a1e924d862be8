// The MoE MLP (models/moe_mlp.h) against a dense reference that loops over tokens: each token's
// router probabilities, its top-k experts picked by hand (ties to the lower index), each chosen
// expert's MLP run on that token alone with its slice of the stacked weights, the gate-weighted
// sum, the shared experts, the capacity dropping slots in token order, and the balancing losses
// from their formulas. Values and every gradient (input, router, experts, shared experts) agree
// to fp32 rounding for both archs' activations. Statistics and option handling too.
#include "tardelli/models/moe_mlp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::models::Arch;
using td::models::GPTConfig;
using td::models::MoEForward;
using td::models::MoEOptions;
using td::models::MoEParams;

namespace {

GPTConfig moe_config(Arch arch, int64_t E, int64_t K, int64_t shared) {
  GPTConfig c;
  c.arch = arch;
  c.d_model = 8;
  c.n_head = 2;
  c.n_layer = 1;
  c.num_experts = E;
  c.moe_top_k = K;
  c.moe_ffn_hidden = 12;
  c.moe_shared_experts = shared;
  c.moe_aux_loss_coeff = 0.1;
  c.moe_z_loss_coeff = 0.01;
  return c;
}

// Parameters with non-zero biases (the model initializes them to 0, which would hide bugs).
MoEParams make_params(const GPTConfig& c, nn::Module& block) {
  uint64_t seed = 100;
  MoEParams p = td::models::register_moe_mlp(block, 0, c, 0.3, 0.3,
                                             [&](const std::string&, const Shape& s, double std) {
                                               return td::test::randn_seeded(s, seed++, std);
                                             });
  autograd::NoGradGuard ng;
  for (auto& [n, t] : p.slots()) {
    if (n.find(".bias") != std::string::npos)
      t->copy_(td::test::randn_seeded(t->sizes(), seed++, 0.1));
  }
  return p;
}

// The cast a GPT does: a differentiable conversion when the dtype differs.
Tensor cast_as_gpt(const Tensor& t, DType dt) {
  return t.defined() && t.dtype() != dt ? to_dtype(t, dt) : t;
}

// The reference forward: y [T, d] and the loss terms, built token by token.
struct Reference {
  Tensor y, loss;
  std::vector<int64_t> routed;
  int64_t dropped = 0;
};

Reference reference(const Tensor& x, const MoEParams& p, const MoEOptions& o, int64_t capacity) {
  const int64_t T = x.size(0), E = o.num_experts, K = o.top_k;
  Tensor logits = linear(x, p.router_w);
  Tensor probs = softmax(logits, 1);
  const std::vector<float> pv = to_vector<float>(probs);
  const std::vector<float> bias = to_vector<float>(p.expert_bias);
  Reference r;
  r.routed.assign(static_cast<size_t>(E), 0);
  std::vector<int64_t> kept(static_cast<size_t>(E), 0);
  TensorList rows;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return pv[t * E + a] + bias[a] > pv[t * E + b] + bias[b];
    });
    Tensor xt = x.narrow(0, t, 1);
    Tensor pt = probs.narrow(0, t, 1);
    Tensor total = zeros({1, 1});
    for (int64_t j = 0; j < K; ++j) total = add(total, pt.narrow(1, order[j], 1));
    Tensor yt = zeros({1, x.size(1)});
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = order[j];
      ++r.routed[e];
      if (capacity >= 0 && kept[e] >= capacity) {
        ++r.dropped;
        continue;
      }
      ++kept[e];
      Tensor gate = pt.narrow(1, e, 1);
      if (K > 1 && o.norm_topk) gate = div(gate, total);
      const auto pick = [e](const Tensor& w) { return w.defined() ? w.select(0, e) : Tensor(); };
      Tensor h = linear(xt, pick(p.fc_w), pick(p.fc_b));
      Tensor out = linear(mlp_activation(h, o.act), pick(p.proj_w), pick(p.proj_b));
      yt = add(yt, mul(out, gate));
    }
    if (p.shared_fc_w.defined()) {
      Tensor hs = linear(xt, p.shared_fc_w, p.shared_fc_b);
      yt = add(yt, linear(mlp_activation(hs, o.act), p.shared_proj_w, p.shared_proj_b));
    }
    rows.push_back(yt);
  }
  r.y = cat(rows, 0);
  // E * sum_e f_e P_e and mean_t logsumexp^2, from their definitions.
  std::vector<float> f(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) f[e] = static_cast<float>(r.routed[e]) / (T * K);
  Tensor aux = mul(sum(mul(mean(probs, {0}), from_vector<float>(f, {E}))), static_cast<double>(E));
  Tensor lse = log(sum(exp(logits), {1}));
  Tensor z = mean(mul(lse, lse));
  r.loss = add(mul(aux, o.aux_loss_coeff), mul(z, o.z_loss_coeff));
  return r;
}

// Gradients of sum(y * gy) + loss w.r.t. x and every parameter, in p.slots() order.
std::vector<Tensor> grads_of(const Tensor& y, const Tensor& loss, const Tensor& gy, const Tensor& x,
                             MoEParams& p) {
  for (auto& [n, t] : p.slots()) t->set_grad(Tensor());
  x.set_grad(Tensor());
  add(sum(mul(y, gy)), loss).backward();
  std::vector<Tensor> g = {x.grad()};
  for (auto& [n, t] : p.slots()) g.push_back(t->grad());
  return g;
}

void compare(const Tensor& x0, const GPTConfig& c, double capacity_factor, bool fuse_act,
             const std::string& what) {
  nn::Module block("Block");
  MoEParams p = make_params(c, block);
  MoEOptions o = MoEOptions::from_config(c, /*training=*/true, fuse_act);
  o.capacity_factor = capacity_factor;
  const int64_t T = x0.size(0);
  const int64_t capacity =
      capacity_factor > 0 ? moe_capacity(capacity_factor, T, c.moe_top_k, c.num_experts) : -1;
  Tensor gy = td::test::randn_seeded({T, c.d_model}, 7);

  Tensor x = x0.clone().set_requires_grad(true);
  MoEForward f = td::models::moe_mlp(x, p, o, cast_as_gpt);
  ASSERT_TRUE(f.loss.defined());
  std::vector<Tensor> got = grads_of(f.y, f.loss, gy, x, p);
  Reference r = reference(x, p, o, capacity);
  std::vector<Tensor> want = grads_of(r.y, r.loss, gy, x, p);

  EXPECT_EQ(f.routed_per_expert, r.routed) << what;
  EXPECT_EQ(f.dropped, r.dropped) << what;
  EXPECT_EQ(f.tokens, T);
  td::test::expect_close(td::test::doubles(f.y), td::test::doubles(r.y), 1e-5, 1e-5, what + " y");
  EXPECT_NEAR(f.loss.item<double>(), r.loss.item<double>(), 1e-6) << what;
  EXPECT_NEAR(o.aux_loss_coeff * f.aux_loss + o.z_loss_coeff * f.z_loss, r.loss.item<double>(),
              1e-6)
      << what;
  const auto slots = p.slots();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string name = i == 0 ? "x" : slots[i - 1].first;
    ASSERT_TRUE(got[i].defined() && want[i].defined()) << what << " " << name;
    td::test::expect_close(td::test::doubles(got[i]), td::test::doubles(want[i]), 1e-5, 1e-4,
                           what + " grad " + name);
  }
}

}  // namespace

TEST(MoEMlp, EqualsTokenLoopReference) {
  Tensor x = td::test::randn_seeded({13, 8}, 1);
  for (Arch arch : {Arch::GPT2, Arch::Llama}) {
    const std::string a = arch == Arch::GPT2 ? "gpt2" : "llama";
    compare(x, moe_config(arch, 4, 2, 0), 0.0, true, a + " E4 K2");
    compare(x, moe_config(arch, 4, 1, 0), 0.0, true, a + " E4 K1");
    compare(x, moe_config(arch, 3, 3, 1), 0.0, true, a + " E3 K3 shared");
    compare(x, moe_config(arch, 4, 2, 2), 0.0, false, a + " E4 K2 shared2 unfused");
  }
}

// With a capacity the reference drops the same slots (token order) and the outputs and
// gradients still agree.
TEST(MoEMlp, CapacityEqualsTokenLoopReference) {
  Tensor x = td::test::randn_seeded({16, 8}, 2);
  compare(x, moe_config(Arch::GPT2, 4, 2, 0), 0.5, true, "gpt2 capacity 0.5");
  compare(x, moe_config(Arch::Llama, 4, 2, 1), 0.75, true, "llama capacity 0.75 shared");
}

// The expert bias changes the choice, and the reference (which adds it to the scores) follows.
TEST(MoEMlp, ExpertBiasSteersSelection) {
  GPTConfig c = moe_config(Arch::GPT2, 4, 2, 0);
  nn::Module block("Block");
  MoEParams p = make_params(c, block);
  p.expert_bias.copy_(from_vector<float>({0.0f, 0.0f, 0.0f, 1.0f}, {4}));
  MoEOptions o = MoEOptions::from_config(c, true, true);
  Tensor x = td::test::randn_seeded({9, 8}, 3);
  MoEForward f = td::models::moe_mlp(x, p, o, cast_as_gpt);
  EXPECT_EQ(f.routed_per_expert[3], 9);  // every token
  Reference r = reference(x, p, o, -1);
  td::test::expect_close(td::test::doubles(f.y), td::test::doubles(r.y), 1e-5, 1e-5, "y");
}

// Evaluation: dropless whatever the capacity factor, no loss term, no statistics.
TEST(MoEMlp, EvalIsDroplessWithoutLoss) {
  GPTConfig c = moe_config(Arch::GPT2, 4, 2, 0);
  nn::Module block("Block");
  MoEParams p = make_params(c, block);
  Tensor x = td::test::randn_seeded({16, 8}, 4);
  MoEOptions dropless = MoEOptions::from_config(c, false, true);
  MoEOptions capped = dropless;
  capped.capacity_factor = 0.25;
  MoEForward a = td::models::moe_mlp(x, p, dropless, cast_as_gpt);
  MoEForward b = td::models::moe_mlp(x, p, capped, cast_as_gpt);
  EXPECT_FALSE(b.loss.defined());
  EXPECT_TRUE(b.routed_per_expert.empty());
  EXPECT_TRUE(td::test::same_bytes(a.y, b.y));
}

// bf16 compute (weights cast to bf16, router in fp32) stays close to fp32.
TEST(MoEMlp, Bfloat16CloseToFloat32) {
  GPTConfig c = moe_config(Arch::Llama, 4, 2, 1);
  nn::Module block("Block");
  MoEParams p = make_params(c, block);
  MoEOptions o = MoEOptions::from_config(c, true, true);
  Tensor x = td::test::randn_seeded({12, 8}, 5);
  MoEForward f32 = td::models::moe_mlp(x, p, o, cast_as_gpt);
  MoEForward bf = td::models::moe_mlp(x.to(DType::BFloat16), p, o, cast_as_gpt);
  EXPECT_EQ(bf.y.dtype(), DType::BFloat16);
  EXPECT_EQ(bf.routed_per_expert, f32.routed_per_expert);
  td::test::expect_close(td::test::doubles(bf.y), td::test::doubles(f32.y), 3e-2, 3e-2, "bf16");
}

TEST(MoEStats, Aggregates) {
  td::models::MoELayerStats s;
  MoEForward f;
  f.routed_per_expert = {6, 2, 0, 0};
  f.tokens = 4;
  f.dropped = 1;
  f.aux_loss = 1.5;
  f.z_loss = 2.0;
  s.add(f);
  s.add(f);
  EXPECT_EQ(s.forwards, 2);
  EXPECT_EQ(s.tokens, 8);
  EXPECT_EQ(s.tokens_per_expert, (std::vector<int64_t>{12, 4, 0, 0}));
  EXPECT_EQ(s.max_load(), 12);
  EXPECT_DOUBLE_EQ(s.mean_load(), 4.0);
  td::models::MoEStats all;
  all.layers = {s, s};
  EXPECT_DOUBLE_EQ(all.aux_loss(), 1.5);
  EXPECT_DOUBLE_EQ(all.z_loss(), 2.0);
  EXPECT_EQ(all.dropped(), 4);
  EXPECT_DOUBLE_EQ(all.max_load_ratio(), 3.0);
}
