#include "tardelli/models/hf_gpt2.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tardelli/checkpoint/safetensors.h"

namespace td::models {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "transformer.";

// One GPT-2 parameter: our name, our shape, and whether HF stores it as a Conv1D weight
// (transposed: [in, out]).
struct Spec {
  std::string name;
  Shape shape;
  bool conv1d = false;
  Shape hf_shape() const { return conv1d ? Shape{shape[1], shape[0]} : shape; }
};

std::vector<Spec> gpt2_specs(const GPTConfig& c) {
  const int64_t d = c.d_model, V = c.vocab_size, ff = ffn_hidden_size(c);
  std::vector<Spec> s = {{"wte.weight", {V, d}}, {"wpe.weight", {c.block_size, d}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    s.push_back({p + "ln_1.weight", {d}});
    s.push_back({p + "ln_1.bias", {d}});
    s.push_back({p + "attn.c_attn.weight", {3 * d, d}, true});
    s.push_back({p + "attn.c_attn.bias", {3 * d}});
    s.push_back({p + "attn.c_proj.weight", {d, d}, true});
    s.push_back({p + "attn.c_proj.bias", {d}});
    s.push_back({p + "ln_2.weight", {d}});
    s.push_back({p + "ln_2.bias", {d}});
    s.push_back({p + "mlp.c_fc.weight", {ff, d}, true});
    s.push_back({p + "mlp.c_fc.bias", {ff}});
    s.push_back({p + "mlp.c_proj.weight", {d, ff}, true});
    s.push_back({p + "mlp.c_proj.bias", {d}});
  }
  s.push_back({"ln_f.weight", {d}});
  s.push_back({"ln_f.bias", {d}});
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Non-parameter buffers older transformers versions saved (the causal mask and its fill value).
bool is_ignored_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.is_same(b)) return true;
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  Tensor ca = a.detach().contiguous(), cb = b.detach().contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// [a, b] -> a new contiguous [b, a] (exact: a copy).
Tensor transposed(const Tensor& t) {
  return t.detach().transpose(0, 1).contiguous();
}

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  TD_CHECK(f.good(), what, ": cannot open '", path, "'");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

json::Value read_json(const std::string& path, const char* what) {
  std::string text = read_text(path, what);
  try {
    return json::parse(text);
  } catch (const Error& e) {
    TD_ERROR(what, ": '", path, "' is not valid JSON: ", e.what());
  }
}

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TD_CHECK(f.good(), "save_hf_gpt2: cannot create '", tmp, "'");
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.flush();
    if (!f.good()) {
      fs::remove(tmp);
      TD_ERROR("save_hf_gpt2: write to '", tmp, "' failed");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    TD_ERROR("save_hf_gpt2: cannot rename '", tmp, "' to '", path, "': ", ec.message());
  }
}

// Reads the tensors of dir's model.safetensors (or its shards), keyed by their file names.
checkpoint::NamedTensors read_hf_tensors(const fs::path& dir, std::string& source) {
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    source = single.string();
    return checkpoint::load_safetensors(source).tensors;
  }
  if (fs::exists(index)) {
    source = index.string();
    json::Value idx = read_json(source, "load_hf_gpt2");
    const json::Value* map = idx.find("weight_map");
    TD_CHECK(map && map->is_object(), "load_hf_gpt2: '", source, "' has no \"weight_map\" object");
    std::set<std::string> shards;
    for (const auto& [name, file] : map->as_object()) {
      TD_CHECK(file.is_string() && file.as_string().find('/') == std::string::npos,
               "load_hf_gpt2: '", source, "': weight_map entry for '", name,
               "' must be a file name in the directory");
      shards.insert(file.as_string());
    }
    checkpoint::NamedTensors all;
    for (const auto& s : shards) {
      auto f = checkpoint::load_safetensors((dir / s).string());
      for (auto& nt : f.tensors) all.push_back(std::move(nt));
    }
    return all;
  }
  const bool has_bin = fs::exists(dir / "pytorch_model.bin");
  TD_ERROR("load_hf_gpt2: '", dir.string(), "' has no model.safetensors",
           has_bin ? " (only pytorch_model.bin: re-save it with save_pretrained(dir, "
                     "safe_serialization=True); tardelli reads safetensors only)"
                   : "");
}

}  // namespace

GPTConfig gpt_config_from_hf(const json::Value& hf, const std::string& where) {
  const std::string p = "load_hf_gpt2: " + where + ": ";
  TD_CHECK(hf.is_object(), p, "must be a JSON object");
  auto get_int = [&](const char* key, int64_t dflt) -> int64_t {
    const json::Value* v = hf.find(key);
    if (v == nullptr || v->is_null()) return dflt;
    TD_CHECK(v->is_int(), p, "\"", key, "\" must be an integer, got ", json::dump(*v));
    return v->as_int();
  };
  auto get_double = [&](const char* key, double dflt) -> double {
    const json::Value* v = hf.find(key);
    if (v == nullptr || v->is_null()) return dflt;
    TD_CHECK(v->is_number(), p, "\"", key, "\" must be a number, got ", json::dump(*v));
    return v->as_double();
  };
  auto get_bool = [&](const char* key, bool dflt) -> bool {
    const json::Value* v = hf.find(key);
    if (v == nullptr || v->is_null()) return dflt;
    TD_CHECK(v->is_bool(), p, "\"", key, "\" must be true or false, got ", json::dump(*v));
    return v->as_bool();
  };
  auto get_string = [&](const char* key, const std::string& dflt) -> std::string {
    const json::Value* v = hf.find(key);
    if (v == nullptr || v->is_null()) return dflt;
    TD_CHECK(v->is_string(), p, "\"", key, "\" must be a string, got ", json::dump(*v));
    return v->as_string();
  };

  const std::string model_type = get_string("model_type", "gpt2");
  TD_CHECK(model_type == "gpt2", p, "model_type is \"", model_type,
           "\"; only GPT-2 checkpoints (model_type \"gpt2\") can be loaded");
  const std::string act = get_string("activation_function", "gelu_new");
  TD_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", p, "activation_function \"", act,
           "\" is not supported: the fused GPT-2 uses GELU with the tanh approximation "
           "(\"gelu_new\")");
  TD_CHECK(get_bool("scale_attn_weights", true), p,
           "scale_attn_weights = false (unscaled attention) is not supported");
  TD_CHECK(!get_bool("scale_attn_by_inverse_layer_idx", false), p,
           "scale_attn_by_inverse_layer_idx = true is not supported");
  TD_CHECK(!get_bool("add_cross_attention", false), p, "add_cross_attention is not supported");
  TD_CHECK(get_bool("tie_word_embeddings", true), p,
           "tie_word_embeddings = false is not supported: tardelli's gpt2 ties lm_head to wte");

  GPTConfig c;
  c.arch = Arch::GPT2;
  c.vocab_size = get_int("vocab_size", 50257);
  const json::Value* npos = hf.find("n_positions");
  c.block_size = (npos && !npos->is_null()) ? get_int("n_positions", 1024) : get_int("n_ctx", 1024);
  c.n_layer = get_int("n_layer", 12);
  c.n_head = get_int("n_head", 12);
  c.n_kv_head = 0;
  c.d_model = get_int("n_embd", 768);
  const int64_t n_inner = get_int("n_inner", 0);
  c.ffn_hidden = n_inner == 4 * c.d_model ? 0 : n_inner;
  c.dropout = get_double("resid_pdrop", 0.1);
  c.norm_eps = get_double("layer_norm_epsilon", 1e-5);
  try {
    c.validate();
  } catch (const Error& e) {
    TD_ERROR(p, "invalid GPT-2 config: ", e.what());
  }
  return c;
}

json::Value hf_config_from_gpt(const GPTConfig& c, DType torch_dtype) {
  TD_CHECK(c.arch == Arch::GPT2,
           "save_hf_gpt2: only arch gpt2 can be exported as a Hugging Face "
           "GPT-2 checkpoint, got arch ",
           arch_name(c.arch));
  TD_CHECK(c.num_experts == 0,
           "save_hf_gpt2: a mixture-of-experts model (num_experts=", c.num_experts,
           ") has no Hugging Face GPT-2 equivalent; only dense models export");
  c.validate();
  const int64_t ff = ffn_hidden_size(c);
  // GPT2Config's fields as transformers' save_pretrained writes them (keys sorted).
  json::Value v = json::Object{};
  v.set("activation_function", "gelu_new");
  v.set("architectures", json::Array{"GPT2LMHeadModel"});
  v.set("attn_pdrop", c.dropout);
  v.set("bos_token_id", 50256);
  v.set("embd_pdrop", c.dropout);
  v.set("eos_token_id", 50256);
  v.set("initializer_range", 0.02);
  v.set("layer_norm_epsilon", c.norm_eps);
  v.set("model_type", "gpt2");
  v.set("n_embd", c.d_model);
  v.set("n_head", c.n_head);
  v.set("n_inner", ff == 4 * c.d_model ? json::Value() : json::Value(ff));
  v.set("n_layer", c.n_layer);
  v.set("n_positions", c.block_size);
  v.set("reorder_and_upcast_attn", false);
  v.set("resid_pdrop", c.dropout);
  v.set("scale_attn_by_inverse_layer_idx", false);
  v.set("scale_attn_weights", true);
  v.set("summary_activation", json::Value());
  v.set("summary_first_dropout", 0.1);
  v.set("summary_proj_to_labels", true);
  v.set("summary_type", "cls_index");
  v.set("summary_use_proj", true);
  v.set("torch_dtype", dtype_name(torch_dtype));
  v.set("use_cache", true);
  v.set("vocab_size", c.vocab_size);
  return v;
}

HFGPT2Checkpoint load_hf_gpt2(const std::string& dir_str) {
  const fs::path dir(dir_str);
  TD_CHECK(fs::is_directory(dir), "load_hf_gpt2: '", dir_str, "' is not a directory");
  const std::string cfg_path = (dir / "config.json").string();
  HFGPT2Checkpoint out;
  out.config = gpt_config_from_hf(read_json(cfg_path, "load_hf_gpt2"), cfg_path);

  std::string source;
  checkpoint::NamedTensors raw = read_hf_tensors(dir, source);
  const std::string p = "load_hf_gpt2: '" + source + "': ";

  // Note [HF names]: GPT2LMHeadModel saves "transformer.h.0...", GPT2Model saves "h.0...";
  // strip the prefix, and refuse a file holding the same parameter under both spellings.
  std::map<std::string, Tensor> by_name;
  std::vector<std::string> unexpected;
  for (auto& [name, t] : raw) {
    std::string ours = name.rfind(kPrefix, 0) == 0 ? name.substr(std::strlen(kPrefix)) : name;
    if (is_ignored_buffer(ours)) continue;
    TD_CHECK(by_name.count(ours) == 0, p, "tensor '", ours,
             "' appears twice (with and without the \"transformer.\" prefix)");
    by_name.emplace(std::move(ours), t);
  }

  std::vector<std::string> missing, bad_shape;
  for (const Spec& s : gpt2_specs(out.config)) {
    auto it = by_name.find(s.name);
    if (it == by_name.end()) {
      missing.push_back(s.name);
      continue;
    }
    const Tensor t = it->second;
    by_name.erase(it);
    if (t.sizes() != s.hf_shape()) {
      bad_shape.push_back(s.name + " " + shape_str(t.sizes()) + " (expected " +
                          shape_str(s.hf_shape()) + (s.conv1d ? ", Conv1D [in, out])" : ")"));
      continue;
    }
    TD_CHECK(t.is_floating_point(), p, "tensor '", s.name, "' has dtype ", dtype_name(t.dtype()),
             " (expected a floating dtype)");
    out.state_dict[s.name] = s.conv1d ? transposed(t) : t;
  }
  // lm_head.weight: tied, so it must repeat wte.weight exactly.
  Tensor lm_head;
  if (auto it = by_name.find("lm_head.weight"); it != by_name.end()) {
    lm_head = it->second;
    by_name.erase(it);
  }
  for (const auto& [name, t] : by_name) unexpected.push_back(name);
  if (!missing.empty() || !bad_shape.empty() || !unexpected.empty()) {
    std::ostringstream os;
    os << p << "does not match the GPT-2 config (n_layer " << out.config.n_layer << ", n_embd "
       << out.config.d_model << ", vocab " << out.config.vocab_size << ", n_positions "
       << out.config.block_size << ")";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      os << "; " << what << ": ";
      for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    };
    list("missing", missing);
    list("wrong shape", bad_shape);
    list("unexpected", unexpected);
    TD_ERROR(os.str());
  }
  const Tensor& wte = out.state_dict.at("wte.weight");
  TD_CHECK(!lm_head.defined() || bitwise_equal(lm_head, wte), p,
           "lm_head.weight differs from wte.weight; tardelli's gpt2 ties them (untied heads are "
           "not supported)");
  out.state_dict["lm_head.weight"] = wte;
  return out;
}

void save_hf_gpt2(const std::string& dir_str, const GPTConfig& config, const nn::StateDict& sd) {
  json::Value cfg_json = hf_config_from_gpt(config, DType::Float32);  // checks arch first
  const std::string p = "save_hf_gpt2: ";
  std::vector<std::string> missing, bad_shape, unexpected;
  std::set<std::string> known;
  checkpoint::NamedTensors hf;
  for (const Spec& s : gpt2_specs(config)) {
    known.insert(s.name);
    auto it = sd.find(s.name);
    if (it == sd.end() || !it->second.defined()) {
      missing.push_back(s.name);
      continue;
    }
    const Tensor& t = it->second;
    if (t.sizes() != s.shape) {
      bad_shape.push_back(s.name + " " + shape_str(t.sizes()) + " (expected " + shape_str(s.shape) +
                          ")");
      continue;
    }
    hf.emplace_back(kPrefix + s.name, s.conv1d ? transposed(t) : t.detach());
  }
  for (const auto& [name, t] : sd)
    if (!known.count(name) && name != "lm_head.weight") unexpected.push_back(name);
  if (!missing.empty() || !bad_shape.empty() || !unexpected.empty()) {
    std::ostringstream os;
    os << p << "the tensors do not match the gpt2 config";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      os << "; " << what << ": ";
      for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    };
    list("missing", missing);
    list("wrong shape", bad_shape);
    list("unexpected", unexpected);
    TD_ERROR(os.str());
  }
  const Tensor& wte = sd.at("wte.weight");
  if (auto it = sd.find("lm_head.weight"); it != sd.end())
    TD_CHECK(bitwise_equal(it->second, wte), p,
             "lm_head.weight differs from wte.weight: a GPT-2 checkpoint ties them");
  cfg_json.set("torch_dtype", dtype_name(wte.dtype()));
  const std::string cfg_text = json::dump(cfg_json, 2) + "\n";

  // Note [Atomic directory]: a new directory appears complete or not at all (written under
  // dir.tmp, then renamed); an existing one is updated file by file, each file atomically.
  const fs::path dir(dir_str);
  if (dir.has_parent_path()) fs::create_directories(dir.parent_path());
  const bool existed = fs::exists(dir);
  TD_CHECK(!existed || fs::is_directory(dir), p, "'", dir_str, "' exists and is not a directory");
  fs::path target = dir;
  if (!existed) {
    target = fs::path(dir_str + ".tmp");
    fs::remove_all(target);
    fs::create_directories(target);
  }
  try {
    checkpoint::save_safetensors((target / "model.safetensors").string(), hf, {{"format", "pt"}});
    write_text_atomic((target / "config.json").string(), cfg_text);
    if (!existed) {
      std::error_code ec;
      fs::rename(target, dir, ec);
      TD_CHECK(!ec, p, "cannot rename '", target.string(), "' to '", dir_str, "': ", ec.message());
    }
  } catch (...) {
    if (!existed) fs::remove_all(target);
    throw;
  }
}

void save_hf_gpt2(const std::string& dir, const GPTConfig& config,
                  const nn::NamedTensors& tensors) {
  nn::StateDict sd;
  for (const auto& [name, t] : tensors)
    TD_CHECK(sd.emplace(name, t).second, "save_hf_gpt2: tensor '", name, "' is given twice");
  save_hf_gpt2(dir, config, sd);
}

std::shared_ptr<GPT> gpt_from_hf(const std::string& dir, DType dtype) {
  HFGPT2Checkpoint ck = load_hf_gpt2(dir);
  ck.config.dtype = dtype;
  auto model = std::make_shared<GPT>(ck.config);
  model->load_state_dict(ck.state_dict, /*strict=*/true);
  return model;
}

void gpt_to_hf(const GPT& model, const std::string& dir) {
  save_hf_gpt2(dir, model.config(), model.state_dict());
}

}  // namespace td::models
