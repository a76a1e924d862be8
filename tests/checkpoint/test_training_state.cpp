// The training-state layout: save after 3 steps, load into a fresh model + optimizer +
// scheduler, continue 3 steps, and the losses, parameters and optimizer moments are bitwise equal
// to the uninterrupted 6-step run (fp32, CPU: every kernel is deterministic, so any difference
// is a restore bug). Also: a different model or optimizer layout is refused before anything is
// changed, the config JSON round-trips, and the files follow the documented layout.
#include "tardelli/checkpoint/training_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/core/error.h"
#include "tardelli/ops/factory.h"
#include "tardelli/optim/adamw.h"
#include "tardelli/optim/clip_grad.h"
#include "test_util.h"

namespace {

namespace ck = td::checkpoint;
using td::Tensor;
using td::models::GPT;
using td::models::GPTConfig;
using td::test::error_of;
using td::test::same_bytes;

GPTConfig tiny(int64_t n_layer = 2) {
  GPTConfig c;
  c.vocab_size = 128;
  c.block_size = 16;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.d_model = 64;
  c.seed = 11;
  return c;
}

// Batches of random tokens [4, 17]: inputs are the first 16, targets the last 16.
std::vector<Tensor> make_batches(int n) {
  std::mt19937_64 rng(5);
  std::vector<Tensor> out;
  for (int i = 0; i < n; ++i) {
    Tensor t = td::empty({4, 17}, {td::DType::Int64});
    auto* p = t.data_ptr<int64_t>();
    for (int64_t k = 0; k < t.numel(); ++k) p[k] = static_cast<int64_t>(rng() % 128);
    out.push_back(t);
  }
  return out;
}

// A model, AdamW over GPT's two groups (optionally each group's parameters reversed, which
// changes the optimizer's packed numbering but not the math) and a warmup-cosine schedule.
struct Trainer {
  explicit Trainer(const GPTConfig& config = tiny(), bool reverse = false)
      : model(std::make_shared<GPT>(config)) {
    std::vector<td::optim::ParamGroup> groups;
    for (auto& g : model->param_groups(0.1)) {
      td::TensorList ps;
      for (auto& [n, p] : g.params) ps.push_back(p);
      if (reverse) std::reverse(ps.begin(), ps.end());
      groups.emplace_back(ps, std::nullopt, g.weight_decay);
    }
    td::optim::AdamWOptions o;
    o.lr = 1e-2;
    o.beta2 = 0.95;
    opt = std::make_unique<td::optim::AdamW>(std::move(groups), o);
    td::optim::LRScheduleConfig s;
    s.max_lr = 1e-2;
    s.min_lr = 1e-3;
    s.warmup_steps = 2;
    s.decay_steps = 6;
    sched = std::make_unique<td::optim::LRScheduler>(*opt, s);
  }
  float step(const Tensor& batch) {
    Tensor x = batch.slice(1, 0, 16).contiguous();
    Tensor y = batch.slice(1, 1, 17).contiguous();
    opt->zero_grad();
    Tensor loss = model->forward(x, y);
    loss.backward();
    td::optim::clip_grad_norm_(model->parameters(), 1.0);
    opt->step();
    sched->step();
    return loss.item<float>();
  }
  std::shared_ptr<GPT> model;
  std::unique_ptr<td::optim::AdamW> opt;
  std::unique_ptr<td::optim::LRScheduler> sched;
};

class TrainingState : public td::test::TempDirTest {};

TEST_F(TrainingState, ResumeIsBitwiseExact) {
  const auto batches = make_batches(6);
  Trainer a;
  std::vector<float> losses_a;
  for (int i = 0; i < 6; ++i) losses_a.push_back(a.step(batches[i]));

  Trainer b;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.step(batches[i]), losses_a[i]);
  td::json::Value extra = td::json::Object{};
  td::json::Value data = td::json::Object{};
  data.set("consumed_samples", 12);
  extra.set("data", data);
  ck::CheckpointWriter w(path(ck::step_dir_name(3)));
  ck::save_training_state(w, *b.model, *b.opt, *b.sched, extra);

  Trainer c(tiny(), /*reverse=*/true);
  {  // Scramble the fresh model so the test sees that loading overwrites every parameter.
    td::autograd::NoGradGuard ng;
    for (auto& p : c.model->parameters()) p.copy_(td::zeros(p.sizes()));
  }
  ck::CheckpointReader r(path(ck::step_dir_name(3)));
  r.verify();
  ck::TrainingState st = ck::load_training_state(r, *c.model, *c.opt, *c.sched);
  EXPECT_EQ(st.step, 3);
  EXPECT_EQ(st.meta.at("data").at("consumed_samples").as_int(), 12);
  EXPECT_EQ(c.sched->last_step(), 3);
  EXPECT_EQ(c.opt->param_groups()[0].lr, b.opt->param_groups()[0].lr);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(c.step(batches[i]), losses_a[i]) << "step " << i;

  const auto pa = a.model->named_parameters();
  const auto pc = c.model->named_parameters();
  ASSERT_EQ(pa.size(), pc.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(same_bytes(pa[i].second, pc[i].second)) << pa[i].first;
  // The moments too (compared by name: c's optimizer numbers its parameters differently).
  auto moments = [](Trainer& run) {
    std::map<std::string, Tensor> m;
    auto sd = run.opt->state_dict();
    std::map<const td::TensorImpl*, std::string> names;
    for (auto& [n, p] : run.model->named_parameters()) names[p.impl()] = n;
    int64_t index = 0;
    for (auto& g : run.opt->param_groups())
      for (auto& p : g.params) {
        for (auto& [k, t] : sd.state.at(index).tensors) m[names[p.impl()] + "." + k] = t;
        ++index;
      }
    return m;
  };
  const auto ma = moments(a), mc = moments(c);
  ASSERT_EQ(ma.size(), mc.size());
  for (const auto& [n, t] : ma) EXPECT_TRUE(same_bytes(t, mc.at(n))) << n;
}

// The files follow docs/checkpoints.md: parameter names, "<name>.exp_avg(_sq)", the optimizer
// metadata, and meta.json's step/config/scheduler.
TEST_F(TrainingState, Layout) {
  Trainer b;
  b.step(make_batches(1)[0]);
  ck::CheckpointWriter w(path("ck"));
  ck::save_training_state(w, *b.model, *b.opt, *b.sched);
  ck::CheckpointReader r(path("ck"));
  auto model = r.read_tensors(ck::kModelFile);
  EXPECT_EQ(model.tensors.size(), b.model->named_parameters().size());
  EXPECT_NE(model.find("h.1.attn.c_attn.weight"), nullptr);
  EXPECT_EQ(model.find("lm_head.weight"), nullptr);  // tied to wte.weight: stored once
  auto optf = r.read_tensors(ck::kOptimizerFile);
  EXPECT_EQ(optf.at("h.0.mlp.c_fc.weight.exp_avg_sq").sizes(), td::Shape({256, 64}));
  auto om = td::json::parse(optf.metadata.at("optimizer"));
  EXPECT_EQ(om.at("name").as_string(), "AdamW");
  ASSERT_EQ(om.at("groups").size(), 2u);
  const auto& g0 = om.at("groups").as_array()[0];
  EXPECT_EQ(g0.at("weight_decay").as_double(), 0.1);
  EXPECT_EQ(g0.at("beta2").as_double(), 0.95);
  EXPECT_EQ(g0.at("eps").as_double(), 1e-8);
  EXPECT_EQ(om.at("step").at("wte.weight").as_int(), 1);
  const auto& meta = r.meta();
  EXPECT_EQ(meta.at("step").as_int(), 1);
  EXPECT_EQ(meta.at("config").at("arch").as_string(), "gpt2");
  EXPECT_EQ(meta.at("config").at("dtype").as_string(), "fp32");
  EXPECT_EQ(meta.at("scheduler").at("style").as_string(), "cosine");
  EXPECT_EQ(meta.at("scheduler").at("warmup_steps").as_int(), 2);
  EXPECT_EQ(meta.at("scheduler").at("last_step").as_int(), 1);
}

// A different model is refused with the differing fields listed; a different optimizer layout is
// refused; in both cases the model's parameters are untouched.
TEST_F(TrainingState, RefusesMismatch) {
  Trainer b;
  b.step(make_batches(1)[0]);
  ck::CheckpointWriter w(path(ck::step_dir_name(100)));
  ck::save_training_state(w, *b.model, *b.opt, *b.sched);
  ck::CheckpointReader r(path(ck::step_dir_name(100)));

  Trainer other(tiny(3));
  std::string e =
      error_of([&] { ck::load_training_state(r, *other.model, *other.opt, *other.sched); });
  EXPECT_NE(e.find("step_00000100 was saved from a different model (checkpoint vs this model): "
                   "n_layer: 2 vs 3"),
            std::string::npos)
      << e;

  Trainer c;
  Tensor before = c.model->named_parameters()[0].second.clone();
  td::optim::AdamW one_group(c.model->parameters());
  e = error_of([&] { ck::load_training_state(r, *c.model, one_group, *c.sched); });
  EXPECT_NE(e.find("2 parameter groups saved, the optimizer has 1"), std::string::npos) << e;
  EXPECT_TRUE(same_bytes(before, c.model->named_parameters()[0].second));

  // Groups with swapped members: the first group of the checkpoint holds the matrices.
  std::vector<td::optim::ParamGroup> swapped;
  auto gs = c.model->param_groups(0.1);
  for (int i = 1; i >= 0; --i) {
    td::TensorList ps;
    for (auto& [n, p] : gs[i].params) ps.push_back(p);
    swapped.emplace_back(ps);
  }
  td::optim::AdamW swapped_opt(std::move(swapped));
  e = error_of([&] { ck::load_training_state(r, *c.model, swapped_opt, *c.sched); });
  EXPECT_NE(e.find("in the checkpoint but not in this optimizer"), std::string::npos) << e;
  EXPECT_TRUE(same_bytes(before, c.model->named_parameters()[0].second));

  // The parameters alone load into a matching model.
  ck::load_model_state(r, *c.model);
  EXPECT_TRUE(
      same_bytes(b.model->named_parameters()[0].second, c.model->named_parameters()[0].second));
}

// A generator's state round-trips (uint64 values above 2^63 included) and reproduces its stream.
TEST(TrainingStateRng, GeneratorJson) {
  td::Generator g(0xF000000000000001ULL, 5);
  g.reserve(40);
  td::json::Value v = td::json::parse(td::json::dump(ck::generator_to_json(g)));
  td::Generator h;
  ck::generator_from_json(v, h);
  EXPECT_EQ(h.seed(), g.seed());
  EXPECT_EQ(h.offset(), 10u);
  EXPECT_EQ(h.subsequence(), 5u);
  EXPECT_EQ(h.reserve(8).offset, g.reserve(8).offset);
  v.set("offset", "ten");
  EXPECT_NE(error_of([&] { ck::generator_from_json(v, h); }).find("\"offset\" must be an integer"),
            std::string::npos);
}

// Every GPTConfig field survives the JSON; missing or mistyped fields are named.
TEST(TrainingStateConfig, JsonRoundTrip) {
  GPTConfig c;
  c.arch = td::models::Arch::Llama;
  c.vocab_size = 1000;
  c.n_layer = 3;
  c.n_head = 8;
  c.n_kv_head = 2;
  c.d_model = 128;
  c.ffn_hidden = 320;
  c.dropout = 0.1;
  c.norm_eps = 1e-6;
  c.rope_base = 500000.0;
  c.dtype = td::DType::BFloat16;
  c.seed = 0xFFFFFFFFFFFFFFF0ULL;
  td::json::Value v = ck::config_to_json(c);
  EXPECT_EQ(v.at("dtype").as_string(), "bf16");
  EXPECT_EQ(v.at("arch").as_string(), "llama");
  GPTConfig back = ck::config_from_json(td::json::parse(td::json::dump(v)));
  EXPECT_EQ(back.diff(c), "");
  EXPECT_EQ(back.seed, c.seed);

  td::json::Value missing = td::json::Object{};
  for (const auto& [k, x] : v.as_object())
    if (k != "n_head") missing.set(k, x);
  EXPECT_NE(error_of([&] { ck::config_from_json(missing); }).find("missing \"n_head\""),
            std::string::npos);
  v.set("dtype", "float32");
  EXPECT_NE(error_of([&] { ck::config_from_json(v); }).find("unknown dtype 'float32'"),
            std::string::npos);
  v.set("dtype", "fp16");
  v.set("n_layer", 2.5);
  EXPECT_NE(error_of([&] { ck::config_from_json(v); }).find("\"n_layer\" must be an integer"),
            std::string::npos);
}

// A mixture-of-experts model: the config's MoE fields round-trip (and a dense config's JSON has
// none), and a resumed run with aux-loss-free bias updates is bitwise the uninterrupted one:
// model.safetensors holds the routers' expert_bias buffers next to the parameters.
GPTConfig tiny_moe() {
  GPTConfig c = tiny();
  c.num_experts = 4;
  c.moe_top_k = 2;
  c.moe_ffn_hidden = 32;
  c.moe_layer_freq = 2;
  c.moe_shared_experts = 1;
  c.moe_z_loss_coeff = 1e-3;
  c.moe_router_bias_update_rate = 0.01;
  c.moe_capacity_factor = 1.5;
  return c;
}

TEST(TrainingStateConfig, MoEJsonRoundTrip) {
  EXPECT_EQ(ck::config_to_json(tiny()).find("num_experts"), nullptr);
  GPTConfig c = tiny_moe();
  c.moe_norm_topk = false;
  td::json::Value v = ck::config_to_json(c);
  EXPECT_EQ(v.at("num_experts").as_int(), 4);
  GPTConfig back = ck::config_from_json(td::json::parse(td::json::dump(v)));
  EXPECT_EQ(back.diff(c), "");
}

TEST_F(TrainingState, MoEResumeIsBitwiseExactWithExpertBias) {
  const auto batches = make_batches(6);
  auto step = [](Trainer& t, const Tensor& batch) {
    const float loss = t.step(batch);
    t.model->update_moe_router_bias();
    return loss;
  };
  Trainer a(tiny_moe());
  std::vector<float> losses_a;
  for (int i = 0; i < 6; ++i) losses_a.push_back(step(a, batches[i]));

  Trainer b(tiny_moe());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(step(b, batches[i]), losses_a[i]);
  ck::CheckpointWriter w(path(ck::step_dir_name(3)));
  ck::save_training_state(w, *b.model, *b.opt, *b.sched);
  ck::CheckpointReader r(path(ck::step_dir_name(3)));
  auto model = r.read_tensors(ck::kModelFile);
  ASSERT_NE(model.find("h.0.mlp.router.expert_bias"), nullptr);
  EXPECT_FALSE(same_bytes(*model.find("h.0.mlp.router.expert_bias"), td::zeros({4})));

  Trainer c(tiny_moe());
  ck::load_training_state(r, *c.model, *c.opt, *c.sched);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(step(c, batches[i]), losses_a[i]) << "step " << i;
  const auto sa = a.model->state_dict(), sc = c.model->state_dict();
  ASSERT_EQ(sa.size(), sc.size());
  for (const auto& [n, t] : sa) EXPECT_TRUE(same_bytes(t, sc.at(n))) << n;

  // A dense model cannot load it (the MoE fields differ).
  Trainer dense;
  EXPECT_NE(error_of([&] { ck::load_model_state(r, *dense.model); }).find("num_experts: 4 vs 0"),
            std::string::npos);
}

}  // namespace
