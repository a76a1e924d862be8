// The fused GPT with mixture-of-experts MLPs (models/gpt.h, models/moe_mlp.h): parameter names,
// shapes and the moe_layer_freq pattern; a one-expert top-1 MoE with the dense MLP's weights is
// the dense model bit for bit; training reduces the loss; the training loss carries the
// balancing terms (evaluation's does not); the capacity drops the expected slots; full
// recomputation changes nothing; the aux-loss-free bias update; generation; pipeline stages
// that hand their loss terms to the runtime; and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::models::Arch;
using td::models::GPT;
using td::models::GPTConfig;
using td::test::error_of;
using td::test::same_bytes;

namespace {

GPTConfig small(Arch arch) {
  GPTConfig c;
  c.arch = arch;
  c.vocab_size = 61;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = arch == Arch::Llama ? 2 : 0;
  c.d_model = 32;
  c.seed = 5;
  return c;
}

GPTConfig small_moe(Arch arch) {
  GPTConfig c = small(arch);
  c.num_experts = 4;
  c.moe_top_k = 2;
  c.moe_ffn_hidden = 48;
  c.moe_shared_experts = 1;
  c.moe_aux_loss_coeff = 0.01;
  c.moe_z_loss_coeff = 1e-3;
  return c;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, {DType::Int64, kCPU, false}, &g);
}

std::map<std::string, Tensor> by_name(const nn::NamedTensors& v) {
  return std::map<std::string, Tensor>(v.begin(), v.end());
}

// The loss and every parameter's gradient of one training forward/backward.
std::pair<float, std::map<std::string, Tensor>> loss_and_grads(GPT& m, const Tensor& x,
                                                               const Tensor& y) {
  m.zero_grad();
  Tensor loss = m.forward(x, y);
  loss.backward();
  std::map<std::string, Tensor> g;
  for (auto& [n, p] : m.named_parameters()) g[n] = p.grad();
  return {loss.item<float>(), g};
}

}  // namespace

// moe_layer_freq 2 with 3 blocks: blocks 0 and 2 are MoE (i % 2 == 0, Megatron's pattern),
// block 1 keeps the dense MLP. Expert weights are stacked [E, ...]; the router's expert_bias is
// a buffer.
TEST(GPTMoE, ParameterNamesShapesAndLayerPattern) {
  for (Arch arch : {Arch::GPT2, Arch::Llama}) {
    GPTConfig c = small_moe(arch);
    c.n_layer = 3;
    c.moe_layer_freq = 2;
    GPT m(c);
    const bool gpt2 = arch == Arch::GPT2;
    const int64_t E = 4, H = 48, d = 32, F = gpt2 ? H : 2 * H;
    const auto p = by_name(m.named_parameters());
    std::map<std::string, Shape> want = {{"mlp.router.weight", {E, d}},
                                         {"mlp.experts.c_fc.weight", {E, F, d}},
                                         {"mlp.experts.c_proj.weight", {E, d, H}},
                                         {"mlp.shared.c_fc.weight", {F, d}},
                                         {"mlp.shared.c_proj.weight", {d, H}}};
    if (gpt2) {
      want["mlp.experts.c_fc.bias"] = {E, H};
      want["mlp.experts.c_proj.bias"] = {E, d};
      want["mlp.shared.c_fc.bias"] = {H};
      want["mlp.shared.c_proj.bias"] = {d};
    }
    for (int i : {0, 2}) {
      const std::string pre = "h." + std::to_string(i) + ".";
      for (const auto& [n, s] : want) {
        ASSERT_TRUE(p.count(pre + n)) << pre + n;
        EXPECT_EQ(p.at(pre + n).sizes(), s) << pre + n;
      }
      EXPECT_FALSE(p.count(pre + "mlp.c_fc.weight"));
      int64_t mlp_params = 0;
      for (const auto& [n, t] : p) mlp_params += n.rfind(pre + "mlp.", 0) == 0;
      EXPECT_EQ(mlp_params, static_cast<int64_t>(want.size()));
    }
    EXPECT_TRUE(p.count("h.1.mlp.c_fc.weight"));
    EXPECT_FALSE(p.count("h.1.mlp.router.weight"));
    const auto buffers = m.named_buffers();
    ASSERT_EQ(buffers.size(), 2u);
    EXPECT_EQ(buffers[0].first, "h.0.mlp.router.expert_bias");
    EXPECT_EQ(buffers[1].first, "h.2.mlp.router.expert_bias");
    EXPECT_TRUE(same_bytes(buffers[0].second, zeros({E})));
    ASSERT_EQ(m.moe_stats().layers.size(), 2u);
    EXPECT_EQ(m.moe_stats().layers[1].layer, 2);
    // Expert biases are 2-D but not decayed.
    const auto groups = m.param_groups(0.1);
    for (const auto& [n, t] : groups[0].params) EXPECT_EQ(n.find(".bias"), std::string::npos) << n;
    // Initialized like the dense MLP: deterministic from the seed, weights ~ N(0, 0.02).
    GPT again(c);
    EXPECT_TRUE(same_bytes(p.at("h.0.mlp.experts.c_fc.weight"),
                           by_name(again.named_parameters()).at("h.0.mlp.experts.c_fc.weight")));
  }
}

// One expert, top-1, dropless, with the dense hidden size: the router's softmax over one expert
// is exactly 1, so with the dense MLP's weights copied into expert 0 the model is the dense model:
// the same loss bit for bit and the same gradients (the expert's are the dense MLP's), in every
// recompute mode.
TEST(GPTMoE, OneExpertEqualsDenseModel) {
  for (Arch arch : {Arch::GPT2, Arch::Llama}) {
    GPTConfig dc = small(arch);
    GPTConfig mc = dc;
    mc.num_experts = 1;
    mc.moe_top_k = 1;
    mc.moe_aux_loss_coeff = 0.0;
    mc.moe_z_loss_coeff = 0.0;
    GPT dense(dc), moe(mc);
    {
      autograd::NoGradGuard ng;
      const auto dp = by_name(dense.named_parameters());
      for (auto& [n, t] : moe.named_parameters()) {
        std::string src = n;
        const auto at = n.find("mlp.experts.");
        if (at != std::string::npos) src = n.substr(0, at) + "mlp." + n.substr(at + 12);
        if (n.find("mlp.router.") != std::string::npos) continue;
        Tensor dst = t;
        dst.copy_(dp.at(src).reshape(t.sizes()));
      }
    }
    Tensor x = tokens(2, 12, dc.vocab_size, 1), y = tokens(2, 12, dc.vocab_size, 2);
    for (auto mode :
         {models::Recompute::Selective, models::Recompute::None, models::Recompute::Full}) {
      dense.set_recompute({mode});
      moe.set_recompute({mode});
      auto [ld, gd] = loss_and_grads(dense, x, y);
      auto [lm, gm] = loss_and_grads(moe, x, y);
      EXPECT_EQ(ld, lm) << models::recompute_name(mode);
      for (const auto& [n, g] : gm) {
        if (n.find("mlp.router.") != std::string::npos) continue;
        std::string src = n;
        const auto at = n.find("mlp.experts.");
        if (at != std::string::npos) src = n.substr(0, at) + "mlp." + n.substr(at + 12);
        td::test::expect_close(td::test::doubles(g), td::test::doubles(gd.at(src)), 1e-7, 1e-6,
                               n + " " + models::recompute_name(mode));
      }
    }
  }
}

// A few AdamW steps on one batch reduce the loss (experts, shared expert, router, balancing
// losses and bias updates all in play), for both archs; the statistics count every forward.
TEST(GPTMoE, TrainingReducesLoss) {
  for (Arch arch : {Arch::GPT2, Arch::Llama}) {
    GPTConfig c = small_moe(arch);
    c.moe_router_bias_update_rate = 1e-3;
    auto m = std::make_shared<GPT>(c);
    optim::AdamWOptions o;
    o.lr = 3e-3;
    optim::AdamW opt(m->parameters(), o);
    Tensor x = tokens(4, 16, c.vocab_size, 3), y = tokens(4, 16, c.vocab_size, 4);
    std::vector<float> losses;
    for (int step = 0; step < 12; ++step) {
      opt.zero_grad();
      Tensor loss = m->forward(x, y);
      loss.backward();
      opt.step();
      m->update_moe_router_bias();
      losses.push_back(loss.item<float>());
    }
    EXPECT_LT(losses.back(), losses.front() - 0.5f)
        << (arch == Arch::GPT2 ? "gpt2 " : "llama ") << losses.front() << " -> " << losses.back();
    const auto& st = m->moe_stats();
    ASSERT_EQ(st.layers.size(), 2u);
    EXPECT_EQ(st.layers[0].forwards, 12);
    EXPECT_EQ(st.layers[0].tokens, 12 * 64);
    int64_t slots = 0;
    for (int64_t n : st.layers[0].tokens_per_expert) slots += n;
    EXPECT_EQ(slots, 12 * 64 * 2);
    EXPECT_GT(st.aux_loss(), 0.9);  // >= 1 up to rounding when balanced, more when not
    EXPECT_GT(st.z_loss(), 0.0);
    EXPECT_GE(st.max_load_ratio(), 1.0);
    m->reset_moe_stats();
    EXPECT_EQ(m->moe_stats().layers[0].forwards, 0);
  }
}

// The training loss is the cross-entropy plus coeff * aux + coeff * z per MoE layer; evaluation
// returns the cross-entropy alone and counts nothing.
TEST(GPTMoE, TrainingLossAddsBalancingTerms) {
  GPTConfig c = small_moe(Arch::GPT2);
  c.moe_aux_loss_coeff = 0.5;
  c.moe_z_loss_coeff = 0.25;
  GPT m(c);
  Tensor x = tokens(2, 16, c.vocab_size, 5), y = tokens(2, 16, c.vocab_size, 6);
  m.eval();
  const double ce = m.forward(x, y).item<double>();
  EXPECT_EQ(m.moe_stats().layers[0].forwards, 0);
  m.train();
  const double total = m.forward(x, y).item<double>();
  double terms = 0;
  for (const auto& l : m.moe_stats().layers) terms += 0.5 * l.aux_loss + 0.25 * l.z_loss;
  EXPECT_GT(terms, 0.4);
  EXPECT_NEAR(total, ce + terms, 1e-5);
}

// capacity = ceil(0.5 * 32 tokens * 2 / 4) = 8 slots per expert: every expert's excess is dropped
// (at least 64 - 32 slots per layer), as the statistics report; evaluation drops nothing.
TEST(GPTMoE, CapacityFactorDropsExpectedSlots) {
  GPTConfig c = small_moe(Arch::Llama);
  c.moe_capacity_factor = 0.5;
  GPT m(c);
  Tensor x = tokens(2, 16, c.vocab_size, 7), y = tokens(2, 16, c.vocab_size, 8);
  m.forward(x, y).backward();
  const int64_t cap = moe_capacity(0.5, 32, 2, 4);
  EXPECT_EQ(cap, 8);
  int64_t total = 0;
  for (const auto& l : m.moe_stats().layers) {
    int64_t want = 0;
    for (int64_t n : l.tokens_per_expert) want += std::max<int64_t>(0, n - cap);
    EXPECT_EQ(l.dropped, want) << "layer " << l.layer;
    EXPECT_GE(l.dropped, 64 - 4 * cap);
    total += l.dropped;
  }
  EXPECT_EQ(m.moe_stats().dropped(), total);
  // The dropless model routes the same way but keeps every slot: a different loss.
  GPTConfig dl = c;
  dl.moe_capacity_factor = 0.0;
  GPT d(dl);
  EXPECT_NE(d.forward(x, y).item<float>(), m.forward(x, y).item<float>());
  EXPECT_EQ(d.moe_stats().dropped(), 0);
}

// Full recomputation reruns the MoE blocks in backward: the loss (balancing terms included) and
// every gradient are bitwise those of selective, and the statistics count each forward once.
TEST(GPTMoE, FullRecomputeIsBitwiseSelective) {
  GPTConfig c = small_moe(Arch::GPT2);
  c.moe_capacity_factor = 1.0;
  GPT a(c), b(c);
  b.set_recompute({models::Recompute::Full});
  Tensor x = tokens(2, 16, c.vocab_size, 9), y = tokens(2, 16, c.vocab_size, 10);
  auto [la, ga] = loss_and_grads(a, x, y);
  auto [lb, gb] = loss_and_grads(b, x, y);
  EXPECT_EQ(la, lb);
  for (const auto& [n, g] : ga) EXPECT_TRUE(same_bytes(g, gb.at(n))) << n;
  EXPECT_EQ(b.moe_stats().layers[0].forwards, 1);
  EXPECT_EQ(b.moe_stats().layers[0].tokens_per_expert, a.moe_stats().layers[0].tokens_per_expert);
}

// update_moe_router_bias applies bias += rate * sign(mean - load) with the loads of the training
// forwards since the last call (two here), then clears them.
TEST(GPTMoE, RouterBiasUpdate) {
  GPTConfig c = small_moe(Arch::GPT2);
  c.moe_router_bias_update_rate = 0.125;
  GPT m(c);
  Tensor x = tokens(2, 16, c.vocab_size, 11), y = tokens(2, 16, c.vocab_size, 12);
  m.forward(x, y);
  m.forward(x, y);
  const std::vector<int64_t> load = m.moe_router_load()[1];
  int64_t total = 0;
  for (int64_t n : load) total += n;
  EXPECT_EQ(total, 2 * 32 * 2);
  m.update_moe_router_bias();
  const std::vector<float> bias =
      to_vector<float>(by_name(m.named_buffers()).at("h.1.mlp.router.expert_bias"));
  for (size_t e = 0; e < 4; ++e) {
    const double diff = total / 4.0 - static_cast<double>(load[e]);
    EXPECT_EQ(bias[e], diff > 0 ? 0.125f : (diff < 0 ? -0.125f : 0.0f)) << e;
  }
  for (const auto& l : m.moe_router_load())
    for (int64_t n : l) EXPECT_EQ(n, 0);
  // The bias is part of the state dict (and so of checkpoints).
  EXPECT_TRUE(m.state_dict().count("h.1.mlp.router.expert_bias"));
}

// Greedy generation with the KV cache equals rerunning the whole context (MoE routing is per
// token and dropless outside training).
TEST(GPTMoE, GenerateMatchesRecompute) {
  GPTConfig c = small_moe(Arch::Llama);
  c.moe_capacity_factor = 0.5;
  GPT m(c);
  {
    autograd::NoGradGuard ng;
    for (auto& p : m.parameters()) {
      if (p.dim() >= 2) mul_(p, 8.0);
    }
  }
  Tensor prompt = tokens(1, 4, c.vocab_size, 13);
  std::vector<int64_t> got = to_vector<int64_t>(m.generate(prompt, 6, 0.0));
  std::vector<int64_t> seq = to_vector<int64_t>(prompt);
  {
    autograd::NoGradGuard ng;
    m.eval();
    for (int s = 0; s < 6; ++s) {
      const auto T = static_cast<int64_t>(seq.size());
      std::vector<float> lg = to_vector<float>(m.forward(from_vector<int64_t>(seq, {1, T})));
      const float* last = lg.data() + (T - 1) * c.vocab_size;
      seq.push_back(std::max_element(last, last + c.vocab_size) - last);
    }
  }
  EXPECT_EQ(got, seq);
}

TEST(GPTMoE, BadConfigsAndUnsupportedPathsAreErrors) {
  auto msg = [](auto change) {
    GPTConfig c = small_moe(Arch::GPT2);
    change(c);
    return error_of([&] { c.validate(); });
  };
  EXPECT_NE(msg([](GPTConfig& c) {
              c.moe_top_k = 5;
            }).find("moe_top_k must be in [1, num_experts = 4], got moe_top_k 5"),
            std::string::npos);
  EXPECT_NE(msg([](GPTConfig& c) {
              c.num_experts = -2;
            }).find("num_experts must be >= 0 (0: dense MLPs), got -2"),
            std::string::npos);
  EXPECT_NE(msg([](GPTConfig& c) { c.moe_ffn_hidden = -1; }).find("moe_ffn_hidden must be >= 0"),
            std::string::npos);
  EXPECT_NE(
      msg([](GPTConfig& c) { c.moe_layer_freq = 0; }).find("moe_layer_freq must be >= 1, got 0"),
      std::string::npos);
  EXPECT_NE(msg([](GPTConfig& c) {
              c.moe_capacity_factor = -0.5;
            }).find("moe_capacity_factor must be a finite value >= 0, got -0.5"),
            std::string::npos);
  EXPECT_NE(
      msg([](GPTConfig& c) { c.moe_shared_experts = -1; }).find("moe_shared_experts must be >= 0"),
      std::string::npos);
  // A dense config ignores the MoE fields.
  EXPECT_EQ(msg([](GPTConfig& c) {
              c.num_experts = 0;
              c.moe_top_k = 9;
            }),
            "");
  // The model validates its config.
  EXPECT_NE(error_of([] {
              GPTConfig c = small_moe(Arch::GPT2);
              c.moe_top_k = 5;
              GPT m(c);
            }).find("got moe_top_k 5"),
            std::string::npos);

  // HF GPT-2 has no MoE.
  GPT m(small_moe(Arch::GPT2));
  td::test::TempDir dir;
  EXPECT_NE(error_of([&] {
              models::gpt_to_hf(m, dir.path("hf"));
            }).find("a mixture-of-experts model (num_experts=4) has no Hugging Face"),
            std::string::npos);
  // A pipeline stage without the head keeps its loss terms for the caller; one not taken
  // before the next forward is an error (it would be lost silently).
  GPT first(small_moe(Arch::GPT2), models::GPTStage{0, 1, true, false});
  first.train();
  first.forward(tokens(1, 8, 61, 1));
  EXPECT_NE(error_of([&] {
              first.forward(tokens(1, 8, 61, 1));
            }).find("MoE loss terms of this pipeline stage's previous forward were not taken"),
            std::string::npos);
  GPTConfig free_of_aux = small_moe(Arch::GPT2);
  free_of_aux.moe_aux_loss_coeff = 0.0;
  free_of_aux.moe_z_loss_coeff = 0.0;
  GPT ok(free_of_aux, models::GPTStage{0, 1, true, false});
  ok.train();
  EXPECT_EQ(ok.forward(tokens(1, 8, 61, 1)).sizes(), (Shape{1, 8, 32}));
  EXPECT_FALSE(ok.take_moe_loss().defined());
}

// Note [MoE losses of a pipeline stage]: the model split into two stages, the first stage's
// MoE loss terms backpropagated together with its output (seed 1, as the loss), gives the whole
// model's loss (last stage's loss + the first stage's terms) and every parameter's gradient.
// Tolerance: fp32, 1e-5 of each gradient's largest magnitude (the same ops in the same order;
// only the engine's accumulation order across the two graphs may differ). Without the terms
// the router gradients of the first stage differ at the 1e-3 level (aux coefficient 0.01).
// Evaluation keeps no terms.
TEST(GPTMoE, PipelineStagesBackpropagateTheirLossTerms) {
  for (Arch arch : {Arch::GPT2, Arch::Llama}) {
    const GPTConfig c = small_moe(arch);
    GPT whole(c);
    whole.train();
    const Tensor x = tokens(2, 8, 61, 3), y = tokens(2, 8, 61, 4);
    auto [want_loss, want] = loss_and_grads(whole, x, y);

    GPT first(c, models::GPTStage{0, 1, true, false});
    GPT second(c, models::GPTStage{1, 1, false, true});
    first.train();
    second.train();
    Tensor h = first.forward(x);
    Tensor terms = first.take_moe_loss();
    ASSERT_TRUE(terms.defined());
    EXPECT_FALSE(first.take_moe_loss().defined());  // taken once
    Tensor hin = h.detach();
    hin.set_requires_grad(true);
    Tensor loss = second.forward_stage(hin, y);
    loss.backward();
    autograd::backward({h, terms}, {hin.grad(), Tensor()});
    EXPECT_NEAR(loss.item<float>() + terms.item<float>(), want_loss, 1e-5 * std::fabs(want_loss));
    // gpt2's tied table: each stage holds a copy; their gradients add up to the whole's.
    std::map<std::string, Tensor> got;
    for (GPT* stage : {&first, &second}) {
      for (auto& [n, p] : stage->named_parameters())
        got[n] = got.count(n) ? add(got[n], p.grad()) : p.grad();
    }
    ASSERT_EQ(got.size(), want.size());
    for (auto& [n, g] : got) {
      ASSERT_TRUE(want.count(n)) << n;
      const Tensor& w = want[n];
      const double scale = std::max(1e-12, max(abs(w)).item<double>());
      EXPECT_LE(max(abs(sub(g, w))).item<double>(), 1e-5 * scale) << n;
    }
    first.eval();
    {
      autograd::NoGradGuard ng;
      first.forward(x);
    }
    EXPECT_FALSE(first.take_moe_loss().defined());
  }
}

// GPT::set_expert_parallel (the layout step behind parallel::apply_expert_parallel): experts that
// do not split over ep, a dense model and a second layout are errors naming the values; a valid
// layout keeps this rank's slice of every stacked expert weight and reports full shapes still.
TEST(GPTMoE, ExpertParallelLayoutChecks) {
  const GPTConfig c = small_moe(Arch::Llama);
  const models::MoEExpertDispatch pass = [](const Tensor& rows, const std::vector<int64_t>&,
                                            const models::MoELocalExperts&) { return rows; };
  auto m = std::make_shared<GPT>(c);
  const int64_t E = c.num_experts;
  EXPECT_NE(error_of([&] { m->set_expert_parallel(0, E + 1, pass); })
                .find("num_experts " + std::to_string(E) +
                      " is not divisible by the "
                      "expert-parallel size " +
                      std::to_string(E + 1)),
            std::string::npos);
  auto dense = std::make_shared<GPT>(small(Arch::Llama));
  EXPECT_NE(error_of([&] { dense->set_expert_parallel(0, 2, pass); }).find("has no experts"),
            std::string::npos);
  std::map<std::string, Tensor> before;
  for (auto& [name, p] : m->named_parameters()) before[name] = p.clone();
  m->set_expert_parallel(1, 2, pass);  // E = 4: experts 2 and 3
  for (auto& [name, p] : m->named_parameters()) {
    if (name.find(".mlp.experts.") == std::string::npos) {
      EXPECT_EQ(p.sizes(), before[name].sizes()) << name;
      continue;
    }
    EXPECT_EQ(p.size(0), E / 2) << name;
    EXPECT_EQ(m->full_shape(name), before[name].sizes()) << name;
    EXPECT_EQ(to_vector<float>(p), to_vector<float>(before[name].narrow(0, E / 2, E / 2))) << name;
  }
  EXPECT_NE(error_of([&] { m->set_expert_parallel(0, 2, pass); }).find("already installed"),
            std::string::npos);
}
