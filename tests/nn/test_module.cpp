// td::nn::Module behaviour (src/nn/module.cpp) through the layers: naming, tied weights,
// state dicts, train/eval, zero_grad, to(dtype).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/nn/nn.h"
#include "tardelli/tardelli.h"

using namespace td;

namespace {

struct Block : nn::Module {
  explicit Block(int64_t d, Generator* gen) : nn::Module("Block") {
    fc = register_module("fc", std::make_shared<nn::Linear>(d, d, true, gen));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(d));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.5, gen));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Dropout> drop;
};

// A nanoGPT-shaped tree: embedding, a list of blocks, a final norm, a head tied to the embedding.
struct Tiny : nn::Module {
  Tiny(int64_t vocab, int64_t d, int64_t layers, uint64_t seed) : nn::Module("Tiny"), gen(seed) {
    wte = register_module("wte", std::make_shared<nn::Embedding>(vocab, d, &gen));
    h = register_module("h", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < layers; ++i) h->push_back(std::make_shared<Block>(d, &gen));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(d));
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(d, vocab, false, &gen));
    lm_head->tie_weight(wte->weight);
  }
  Tensor forward(const Tensor& idx) {
    Tensor x = wte->forward(idx);
    for (const auto& m : *h) {
      auto b = std::static_pointer_cast<Block>(m);
      x = add(x, b->drop->forward(b->fc->forward(b->ln->forward(x))));
    }
    return lm_head->forward(ln_f->forward(x));
  }
  Generator gen;
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::ModuleList> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;
};

std::vector<std::string> names_of(const nn::NamedTensors& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

bool throws_with(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) {
      if (msg.find(p) == std::string::npos) {
        ADD_FAILURE() << "message lacks '" << p << "': " << msg;
        return false;
      }
    }
    return true;
  }
  return false;
}

}  // namespace

// named_parameters lists parameters in registration order, recursing depth-first, with dotted
// names; the tied head weight is the embedding's tensor and appears once (under wte.weight),
// while state_dict lists it under both names (torch's behaviour).
TEST(NNModule, NamedParametersOrderAndTiedWeightOnce) {
  auto m = std::make_shared<Tiny>(11, 8, 2, 1);
  std::vector<std::string> want = {"wte.weight",  "h.0.fc.weight", "h.0.fc.bias", "h.0.ln.weight",
                                   "h.0.ln.bias", "h.1.fc.weight", "h.1.fc.bias", "h.1.ln.weight",
                                   "h.1.ln.bias", "ln_f.weight",   "ln_f.bias"};
  EXPECT_EQ(names_of(m->named_parameters()), want);
  EXPECT_EQ(m->parameters().size(), want.size());
  EXPECT_EQ(m->num_parameters(), 11 * 8 + 2 * (8 * 8 + 8 + 8 + 8) + 8 + 8);
  EXPECT_TRUE(m->lm_head->weight.is_same(m->wte->weight));
  auto sd = m->state_dict();
  EXPECT_EQ(sd.size(), want.size() + 1);
  ASSERT_TRUE(sd.count("lm_head.weight"));
  EXPECT_TRUE(sd.at("lm_head.weight").shares_storage(m->wte->weight));
  // Non-recursive: the root has no parameters of its own.
  EXPECT_TRUE(m->named_parameters(false).empty());
  // named_modules: root first, then depth-first with dotted names.
  std::vector<std::string> mods;
  for (auto& [n, mm] : m->named_modules()) mods.push_back(n + ":" + mm->type_name());
  std::vector<std::string> want_mods = {
      ":Tiny",         "wte:Embedding",    "h:ModuleList",     "h.0:Block",
      "h.0.fc:Linear", "h.0.ln:LayerNorm", "h.0.drop:Dropout", "h.1:Block",
      "h.1.fc:Linear", "h.1.ln:LayerNorm", "h.1.drop:Dropout", "ln_f:LayerNorm",
      "lm_head:Linear"};
  EXPECT_EQ(mods, want_mods);
}

// A state dict saved from one model and loaded into another (different seed) makes every
// parameter bitwise equal, and the tied weight stays one tensor.
TEST(NNModule, StateDictRoundTrip) {
  auto a = std::make_shared<Tiny>(11, 8, 2, 1);
  auto b = std::make_shared<Tiny>(11, 8, 2, 2);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  EXPECT_NE(to_vector<float>(pa[1].second), to_vector<float>(pb[1].second));
  b->load_state_dict(a->state_dict());
  pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(to_vector<float>(pa[i].second), to_vector<float>(pb[i].second)) << pa[i].first;
    EXPECT_FALSE(pa[i].second.shares_storage(pb[i].second)) << "load copies values";
  }
  EXPECT_TRUE(b->lm_head->weight.is_same(b->wte->weight));
}

// strict loading names the missing and unexpected keys; a shape mismatch is an error in both
// modes and names the key and both shapes; non-strict loading applies the keys it finds.
TEST(NNModule, LoadStateDictErrors) {
  auto m = std::make_shared<Tiny>(11, 8, 1, 1);
  auto sd = m->state_dict();
  auto missing = sd;
  missing.erase("h.0.fc.bias");
  EXPECT_TRUE(throws_with([&] { m->load_state_dict(missing); }, {"missing keys", "h.0.fc.bias"}));
  auto extra = sd;
  extra["h.0.fc.extra"] = zeros({3});
  EXPECT_TRUE(throws_with([&] { m->load_state_dict(extra); }, {"unexpected keys", "h.0.fc.extra"}));
  auto bad = sd;
  bad["ln_f.weight"] = zeros({9});
  EXPECT_TRUE(throws_with([&] { m->load_state_dict(bad); }, {"ln_f.weight", "[9]", "[8]"}));
  EXPECT_TRUE(throws_with([&] { m->load_state_dict(bad, false); }, {"size mismatch"}));
  // Non-strict: the present key is loaded, missing/unexpected are ignored.
  nn::StateDict partial;
  partial["ln_f.bias"] = full({8}, 0.25);
  partial["nonexistent"] = zeros({1});
  m->load_state_dict(partial, false);
  EXPECT_EQ(to_vector<float>(m->ln_f->bias), std::vector<float>(8, 0.25f));
}

// train()/eval() reach every submodule; Dropout is the identity in eval mode only.
TEST(NNModule, TrainEvalPropagates) {
  auto m = std::make_shared<Tiny>(11, 8, 2, 1);
  auto drop = std::static_pointer_cast<Block>((*m->h)[1])->drop;
  Tensor x = ones({4, 64});
  EXPECT_TRUE(drop->is_training());
  EXPECT_NE(to_vector<float>(drop->forward(x)), to_vector<float>(x));
  m->eval();
  for (auto& [n, mm] : m->named_modules()) EXPECT_FALSE(mm->is_training()) << n;
  EXPECT_EQ(to_vector<float>(drop->forward(x)), to_vector<float>(x));
  m->train();
  for (auto& [n, mm] : m->named_modules()) EXPECT_TRUE(mm->is_training()) << n;
}

// zero_grad(false) keeps zero-filled gradients; zero_grad() (set_to_none) drops them.
TEST(NNModule, ZeroGrad) {
  auto m = std::make_shared<Tiny>(11, 8, 1, 1);
  m->eval();
  Tensor idx = from_vector<int64_t>({1, 2, 3}, {3});
  sum(m->forward(idx)).backward();
  for (auto& [n, p] : m->named_parameters()) ASSERT_TRUE(p.grad().defined()) << n;
  double total = 0;
  for (auto& p : m->parameters()) total += sum(abs(p.grad())).item_double();
  EXPECT_GT(total, 0);
  m->zero_grad(false);
  for (auto& [n, p] : m->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n;
    for (float v : to_vector<float>(p.grad())) ASSERT_EQ(v, 0.0f) << n;
  }
  m->zero_grad();
  for (auto& [n, p] : m->named_parameters()) EXPECT_FALSE(p.grad().defined()) << n;
}

// to(bf16) converts every parameter in place: the layers' handles and the tied weight see the
// converted tensor, values are the bf16 rounding of the fp32 ones, and forward runs in bf16.
TEST(NNModule, ToBFloat16) {
  auto m = std::make_shared<Tiny>(11, 8, 1, 1);
  m->eval();
  std::vector<float> before = to_vector<float>(m->h->at<Block>(0)->fc->weight);
  m->to(DType::BFloat16);
  for (auto& [n, p] : m->named_parameters()) EXPECT_EQ(p.dtype(), DType::BFloat16) << n;
  EXPECT_EQ(m->lm_head->weight.dtype(), DType::BFloat16);
  EXPECT_TRUE(m->lm_head->weight.is_same(m->wte->weight));
  std::vector<float> after = to_vector<float>(m->h->at<Block>(0)->fc->weight);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(after[i], static_cast<float>(BFloat16(before[i]))) << i;
  }
  Tensor y = m->forward(from_vector<int64_t>({1, 2}, {2}));
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  EXPECT_EQ(y.sizes(), Shape({2, 11}));
  EXPECT_THROW(m->to(DType::Int64), Error);
}

// Registration rejects duplicate names, dotted names and non-leaf parameters.
TEST(NNModule, RegistrationErrors) {
  nn::Module m("M");
  m.register_parameter("w", zeros({2}));
  EXPECT_THROW(m.register_parameter("w", zeros({2})), Error);
  EXPECT_THROW(m.register_parameter("a.b", zeros({2})), Error);
  Tensor leaf = zeros({2});
  leaf.set_requires_grad(true);
  EXPECT_THROW(m.register_parameter("nl", mul(leaf, 2.0)), Error);
  EXPECT_THROW(m.register_module("w", std::make_shared<nn::GELU>()), Error);
}
