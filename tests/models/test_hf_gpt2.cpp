// HF GPT-2 interop (models/hf_gpt2.h): save -> load -> save is bitwise, HF naming and Conv1D
// layout, files without the "transformer." prefix, tied lm_head, and every unsupported or
// inconsistent checkpoint as a clear td::Error. The comparison against transformers itself is
// tests/python/test_hf_interop.py.
#include "tardelli/models/hf_gpt2.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "tardelli/checkpoint/safetensors.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace td;
using namespace td::test;
using td::checkpoint::load_safetensors;
using td::checkpoint::save_safetensors;
using td::models::Arch;
using td::models::GPT;
using td::models::GPTConfig;

GPTConfig tiny(Arch arch = Arch::GPT2) {
  GPTConfig c;
  c.arch = arch;
  c.vocab_size = 50;
  c.block_size = 12;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.seed = 3;
  return c;
}

class HFGPT2 : public td::test::TempDirTest {};

// Rewrites dir/model.safetensors through `edit` (names and tensors in file order).
void edit_file(const std::string& dir, const std::function<void(checkpoint::NamedTensors&)>& edit) {
  const std::string p = dir + "/model.safetensors";
  auto f = load_safetensors(p);
  edit(f.tensors);
  save_safetensors(p, f.tensors, f.metadata);
}

// Property: a model exported and re-imported has the same config and bitwise the same
// parameters (so bitwise the same logits); exporting the import again gives byte-identical files.
TEST_F(HFGPT2, RoundTripIsBitwise) {
  auto model = std::make_shared<GPT>(tiny());
  models::gpt_to_hf(*model, path("a"));
  EXPECT_TRUE(fs::exists(path("a/config.json")));
  EXPECT_FALSE(fs::exists(path("a.tmp")));

  auto ck = models::load_hf_gpt2(path("a"));
  GPTConfig expected = model->config();
  expected.seed = GPTConfig{}.seed;  // the seed is not part of an HF config
  EXPECT_EQ(ck.config.diff(expected), "");
  const auto sd = model->state_dict();
  ASSERT_EQ(ck.state_dict.size(), sd.size());
  for (const auto& [name, t] : sd) {
    ASSERT_TRUE(ck.state_dict.count(name)) << name;
    EXPECT_TRUE(same_bytes(ck.state_dict.at(name), t)) << name;
  }
  // Tied: lm_head.weight is wte.weight itself.
  EXPECT_TRUE(ck.state_dict.at("lm_head.weight").is_same(ck.state_dict.at("wte.weight")));

  models::save_hf_gpt2(path("b"), ck.config, ck.state_dict);
  EXPECT_EQ(read_bytes(path("a/model.safetensors")), read_bytes(path("b/model.safetensors")));
  EXPECT_EQ(read_bytes(path("a/config.json")), read_bytes(path("b/config.json")));

  auto back = models::gpt_from_hf(path("b"));
  back->eval();
  model->eval();
  Generator g(1);
  Tensor idx = randint(0, 50, {2, 7}, {DType::Int64, kCPU, false}, &g);
  EXPECT_TRUE(same_bytes(back->forward(idx), model->forward(idx)));
}

// Property: the file uses HF's names and layout: "transformer." prefix, Conv1D weights [in, out]
// (the transpose of ours), no lm_head (tied), {"format": "pt"} metadata; config.json is a
// GPT2Config.
TEST_F(HFGPT2, FileUsesHFNamesAndConv1DLayout) {
  GPTConfig c = tiny();
  c.ffn_hidden = 24;  // not 4d: written as n_inner
  auto model = std::make_shared<GPT>(c);
  models::gpt_to_hf(*model, path("m"));
  auto f = load_safetensors(path("m/model.safetensors"));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);
  EXPECT_EQ(f.find("wte.weight"), nullptr);
  const auto sd = model->state_dict();
  EXPECT_TRUE(same_bytes(f.at("transformer.wte.weight"), sd.at("wte.weight")));
  EXPECT_TRUE(same_bytes(f.at("transformer.h.1.ln_2.bias"), sd.at("h.1.ln_2.bias")));
  for (const char* w : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
    const std::string n = std::string("h.0.") + w + ".weight";
    EXPECT_TRUE(same_bytes(f.at("transformer." + n), sd.at(n).t())) << n;
  }
  EXPECT_EQ(f.at("transformer.h.0.mlp.c_fc.weight").sizes(), (Shape{16, 24}));

  json::Value cfg = json::parse(read_bytes(path("m/config.json")));
  EXPECT_EQ(cfg.at("model_type").as_string(), "gpt2");
  EXPECT_EQ(cfg.at("architectures").as_array().at(0).as_string(), "GPT2LMHeadModel");
  EXPECT_EQ(cfg.at("activation_function").as_string(), "gelu_new");
  EXPECT_EQ(cfg.at("n_embd").as_int(), 16);
  EXPECT_EQ(cfg.at("n_inner").as_int(), 24);
  EXPECT_EQ(cfg.at("n_positions").as_int(), 12);
  EXPECT_EQ(cfg.at("layer_norm_epsilon").as_double(), 1e-5);
  EXPECT_EQ(cfg.at("torch_dtype").as_string(), "float32");
  EXPECT_EQ(models::load_hf_gpt2(path("m")).config.ffn_hidden, 24);
}

// Property: a file without the "transformer." prefix (GPT2Model), with the old attention
// buffers, and with an lm_head.weight equal to wte loads to the same tensors.
TEST_F(HFGPT2, PrefixlessFilesBuffersAndTiedHead) {
  auto model = std::make_shared<GPT>(tiny());
  models::gpt_to_hf(*model, path("m"));
  auto ref = models::load_hf_gpt2(path("m"));
  edit_file(path("m"), [](checkpoint::NamedTensors& ts) {
    Tensor wte;
    for (auto& [n, t] : ts) {
      n = n.substr(std::strlen("transformer."));
      if (n == "wte.weight") wte = t;
    }
    ts.emplace_back("lm_head.weight", wte.clone());
    ts.emplace_back("h.0.attn.bias", ones({1, 1, 12, 12}));
    ts.emplace_back("h.0.attn.masked_bias", scalar_tensor(-1e4));
  });
  auto ck = models::load_hf_gpt2(path("m"));
  ASSERT_EQ(ck.state_dict.size(), ref.state_dict.size());
  for (const auto& [name, t] : ref.state_dict)
    EXPECT_TRUE(same_bytes(ck.state_dict.at(name), t)) << name;
}

// Property: every checkpoint we cannot represent exactly, and every inconsistency between
// config and tensors, is a td::Error that says which file and what.
TEST_F(HFGPT2, UnsupportedOrInconsistentCheckpointsAreErrors) {
  auto model = std::make_shared<GPT>(tiny());
  const std::string d = path("m");
  models::gpt_to_hf(*model, d);
  const std::string cfg_text = read_bytes(d + "/config.json");
  auto with_config = [&](const std::string& from, const std::string& to) {
    std::string t = cfg_text;
    size_t pos = t.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    t.replace(pos, from.size(), to);
    write_bytes(d + "/config.json", t);
    std::string err = error_of([&] { models::load_hf_gpt2(d); });
    write_bytes(d + "/config.json", cfg_text);
    return err;
  };
  auto has = [](const std::string& err, const std::string& s) {
    return err.find(s) != std::string::npos;
  };
  std::string e;
  e = with_config("\"gelu_new\"", "\"relu\"");
  EXPECT_TRUE(has(e, "config.json") && has(e, "activation_function \"relu\"")) << e;
  e = with_config("\"model_type\": \"gpt2\"", "\"model_type\": \"llama\"");
  EXPECT_TRUE(has(e, "model_type is \"llama\"")) << e;
  e = with_config("\"scale_attn_weights\": true", "\"scale_attn_weights\": false");
  EXPECT_TRUE(has(e, "scale_attn_weights")) << e;
  e = with_config("\"n_head\": 2", "\"n_head\": 3");
  EXPECT_TRUE(has(e, "invalid GPT-2 config") && has(e, "n_head (3) must divide d_model")) << e;
  e = with_config("\"n_embd\": 16", "\"n_embd\": \"16\"");
  EXPECT_TRUE(has(e, "\"n_embd\" must be an integer")) << e;
  e = with_config("{", "{{");
  EXPECT_TRUE(has(e, "is not valid JSON") && has(e, "at byte 1")) << e;
  // Config and tensors disagree: every problem is listed.
  e = with_config("\"n_layer\": 2", "\"n_layer\": 3");
  EXPECT_TRUE(has(e, "model.safetensors") && has(e, "missing: h.2.ln_1.weight")) << e;
  e = with_config("\"vocab_size\": 50", "\"vocab_size\": 51");
  EXPECT_TRUE(has(e, "wrong shape: wte.weight [50, 16] (expected [51, 16])")) << e;

  edit_file(d, [](checkpoint::NamedTensors& ts) { ts.emplace_back("extra.weight", ones({2})); });
  e = error_of([&] { models::load_hf_gpt2(d); });
  EXPECT_TRUE(has(e, "unexpected: extra.weight")) << e;
  models::gpt_to_hf(*model, d);
  edit_file(d, [](checkpoint::NamedTensors& ts) {
    ts.emplace_back("lm_head.weight", ones({50, 16}));
  });
  e = error_of([&] { models::load_hf_gpt2(d); });
  EXPECT_TRUE(has(e, "lm_head.weight differs from wte.weight")) << e;
  models::gpt_to_hf(*model, d);
  edit_file(d, [](checkpoint::NamedTensors& ts) {
    ts.emplace_back("h.0.ln_1.weight", ts[0].second.clone());  // also under the short name
  });
  e = error_of([&] { models::load_hf_gpt2(d); });
  EXPECT_TRUE(has(e, "tensor 'h.0.ln_1.weight' appears twice")) << e;
  models::gpt_to_hf(*model, d);
  edit_file(d, [](checkpoint::NamedTensors& ts) {
    for (auto& [n, t] : ts)
      if (n == "transformer.h.0.attn.c_attn.weight") t = t.t().contiguous();  // [out, in]
  });
  e = error_of([&] { models::load_hf_gpt2(d); });
  EXPECT_TRUE(has(e, "h.0.attn.c_attn.weight [48, 16] (expected [16, 48], Conv1D [in, out])")) << e;

  // No safetensors file.
  fs::remove(d + "/model.safetensors");
  write_bytes(d + "/pytorch_model.bin", "x");
  e = error_of([&] { models::load_hf_gpt2(d); });
  EXPECT_TRUE(has(e, "has no model.safetensors") && has(e, "safe_serialization=True")) << e;
  e = error_of([&] { models::load_hf_gpt2(path("nope")); });
  EXPECT_TRUE(has(e, "is not a directory")) << e;

  // Export: only gpt2, and the tensors must match the config.
  auto llama = std::make_shared<GPT>(tiny(Arch::Llama));
  e = error_of([&] { models::gpt_to_hf(*llama, path("l")); });
  EXPECT_TRUE(has(e, "only arch gpt2 can be exported") && has(e, "llama")) << e;
  EXPECT_FALSE(fs::exists(path("l")));
  auto sd = model->state_dict();
  sd.erase("ln_f.bias");
  e = error_of([&] { models::save_hf_gpt2(path("s"), model->config(), sd); });
  EXPECT_TRUE(has(e, "missing: ln_f.bias")) << e;
  EXPECT_FALSE(fs::exists(path("s")));
  EXPECT_FALSE(fs::exists(path("s.tmp")));
  sd = model->state_dict();
  sd["lm_head.weight"] = zeros({50, 16});
  e = error_of([&] { models::save_hf_gpt2(path("s"), model->config(), sd); });
  EXPECT_TRUE(has(e, "lm_head.weight differs from wte.weight")) << e;
}

// Property: saving into an existing directory replaces our two files atomically and keeps the
// others (a tokenizer saved alongside).
TEST_F(HFGPT2, SaveIntoExistingDirectoryKeepsOtherFiles) {
  const std::string d = path("m");
  fs::create_directories(d);
  write_bytes(d + "/tokenizer.json", "{}");
  auto model = std::make_shared<GPT>(tiny());
  models::gpt_to_hf(*model, d);
  EXPECT_EQ(read_bytes(d + "/tokenizer.json"), "{}");
  EXPECT_FALSE(fs::exists(d + "/model.safetensors.tmp"));
  EXPECT_FALSE(fs::exists(d + "/config.json.tmp"));
  auto ck = models::load_hf_gpt2(d);
  EXPECT_TRUE(same_bytes(ck.state_dict.at("h.1.mlp.c_proj.weight"),
                         model->state_dict().at("h.1.mlp.c_proj.weight")));
}

}  // namespace
