#include "tardelli/checkpoint/training_state.h"

#include <map>
#include <set>
#include <unordered_map>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/core/error.h"

namespace td::checkpoint {

namespace {

const char* style_name(optim::DecayStyle s) {
  switch (s) {
    case optim::DecayStyle::Cosine:
      return "cosine";
    case optim::DecayStyle::Linear:
      return "linear";
    case optim::DecayStyle::Constant:
      return "constant";
  }
  TD_ERROR("scheduler: invalid decay style ", static_cast<int>(s));
}

const json::Value& field(const json::Value& obj, const char* key, const char* where) {
  const json::Value* v = obj.is_object() ? obj.find(key) : nullptr;
  TD_CHECK(v != nullptr, where, ": missing \"", key, "\"");
  return *v;
}

int64_t int_field(const json::Value& obj, const char* key, const char* where) {
  const json::Value& v = field(obj, key, where);
  TD_CHECK(v.is_int(), where, ": \"", key, "\" must be an integer, got ",
           json::type_name(v.type()));
  return v.as_int();
}

double num_field(const json::Value& obj, const char* key, const char* where) {
  const json::Value& v = field(obj, key, where);
  TD_CHECK(v.is_number(), where, ": \"", key, "\" must be a number, got ",
           json::type_name(v.type()));
  return v.as_double();
}

bool bool_field(const json::Value& obj, const char* key, const char* where) {
  const json::Value& v = field(obj, key, where);
  TD_CHECK(v.is_bool(), where, ": \"", key, "\" must be true or false, got ",
           json::type_name(v.type()));
  return v.as_bool();
}

std::string str_field(const json::Value& obj, const char* key, const char* where) {
  const json::Value& v = field(obj, key, where);
  TD_CHECK(v.is_string(), where, ": \"", key, "\" must be a string, got ",
           json::type_name(v.type()));
  return v.as_string();
}

// Model name of every parameter, by tensor identity (Note [Optimizer state by name]).
std::unordered_map<const TensorImpl*, std::string> names_by_identity(const models::GPT& model) {
  std::unordered_map<const TensorImpl*, std::string> m;
  for (const auto& [n, p] : model.named_parameters()) m.emplace(p.impl(), n);
  return m;
}

// The model names of the optimizer's parameters, in its packed (group) order.
std::vector<std::vector<std::string>> optimizer_param_names(const models::GPT& model,
                                                            const optim::Optimizer& opt) {
  const auto by_id = names_by_identity(model);
  std::vector<std::vector<std::string>> out;
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    std::vector<std::string> names;
    const auto& params = opt.param_groups()[g].params;
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = by_id.find(params[i].impl());
      TD_CHECK(it != by_id.end(), "checkpoint: parameter ", i, " of optimizer group ", g, " (",
               describe(params[i]), ") is not a parameter of the model");
      names.push_back(it->second);
    }
    out.push_back(std::move(names));
  }
  return out;
}

void check_config(const CheckpointReader& reader, const models::GPT& model) {
  const models::GPTConfig saved =
      config_from_json(field(reader.meta(), "config", "checkpoint meta.json"));
  std::string d = saved.diff(model.config());
  if (d.empty()) return;
  while (!d.empty() && d.back() == '\n') d.pop_back();
  for (size_t p = d.find('\n'); p != std::string::npos; p = d.find('\n', p)) d.replace(p, 1, "; ");
  TD_ERROR("checkpoint ", reader.path(),
           " was saved from a different model (checkpoint vs this model): ", d);
}

// Every tensor model.safetensors holds: the parameters (tied ones once), then the buffers (the
// MoE routers' expert_bias; a dense GPT has none).
NamedTensors model_tensors(const models::GPT& model) {
  NamedTensors t = model.named_parameters();
  for (auto& b : model.named_buffers()) t.push_back(std::move(b));
  return t;
}

// Validates model.safetensors against the model; returns (parameter, saved tensor) pairs.
std::vector<std::pair<Tensor, Tensor>> match_parameters(const CheckpointReader& reader,
                                                        const models::GPT& model) {
  SafetensorsFile f = reader.read_tensors(kModelFile);
  const std::string where = "checkpoint " + reader.path() + "/" + kModelFile;
  std::vector<std::pair<Tensor, Tensor>> pairs;
  std::set<std::string> names;
  for (const auto& [n, p] : model_tensors(model)) {
    const Tensor* t = f.find(n);
    TD_CHECK(t != nullptr, where, ": parameter '", n, "' is missing");
    TD_CHECK(t->sizes() == p.sizes() && t->dtype() == p.dtype(), where, ": parameter '", n, "' is ",
             describe(*t), ", the model's is ", describe(p));
    pairs.emplace_back(p, *t);
    names.insert(n);
  }
  for (const auto& [n, t] : f.tensors)
    TD_CHECK(names.count(n), where, ": unexpected tensor '", n, "' (not a parameter of the model)");
  return pairs;
}

void copy_parameters(const std::vector<std::pair<Tensor, Tensor>>& pairs) {
  autograd::NoGradGuard ng;
  for (const auto& [p, t] : pairs) {
    Tensor dst = p;  // a handle to the same tensor: copy_ writes the model's storage
    dst.copy_(t);
  }
}

}  // namespace

// ---- config and scheduler JSON ----

const char* short_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "fp32";
    case DType::BFloat16:
      return "bf16";
    case DType::Float16:
      return "fp16";
    default:
      TD_ERROR("checkpoint: no short name for dtype ", dtype_name(dtype),
               " (expected fp32, bf16 or fp16)");
  }
}

DType parse_short_dtype(const std::string& name) {
  if (name == "fp32") return DType::Float32;
  if (name == "bf16") return DType::BFloat16;
  if (name == "fp16") return DType::Float16;
  TD_ERROR("checkpoint: unknown dtype '", name, "' (expected fp32, bf16 or fp16)");
}

json::Value config_to_json(const models::GPTConfig& c) {
  json::Value v = json::Object{};
  v.set("arch", models::arch_name(c.arch));
  v.set("vocab_size", c.vocab_size);
  v.set("block_size", c.block_size);
  v.set("n_layer", c.n_layer);
  v.set("n_head", c.n_head);
  v.set("n_kv_head", c.n_kv_head);
  v.set("d_model", c.d_model);
  v.set("ffn_hidden", c.ffn_hidden);
  v.set("dropout", c.dropout);
  v.set("norm_eps", c.norm_eps);
  v.set("rope_base", c.rope_base);
  v.set("dtype", short_dtype_name(c.dtype));
  v.set("seed", static_cast<int64_t>(c.seed));  // bit pattern kept: a seed >= 2^63 reads back
  // The MoE fields only for MoE models: a dense model's meta.json is what it always was.
  if (c.num_experts > 0) {
    v.set("num_experts", c.num_experts);
    v.set("moe_top_k", c.moe_top_k);
    v.set("moe_ffn_hidden", c.moe_ffn_hidden);
    v.set("moe_layer_freq", c.moe_layer_freq);
    v.set("moe_shared_experts", c.moe_shared_experts);
    v.set("moe_norm_topk", c.moe_norm_topk);
    v.set("moe_aux_loss_coeff", c.moe_aux_loss_coeff);
    v.set("moe_z_loss_coeff", c.moe_z_loss_coeff);
    v.set("moe_router_bias_update_rate", c.moe_router_bias_update_rate);
    v.set("moe_capacity_factor", c.moe_capacity_factor);
  }
  return v;
}

models::GPTConfig config_from_json(const json::Value& v) {
  const char* w = "checkpoint config";
  TD_CHECK(v.is_object(), w, " must be a JSON object, got ", json::type_name(v.type()));
  models::GPTConfig c;
  c.arch = models::parse_arch(str_field(v, "arch", w));
  c.vocab_size = int_field(v, "vocab_size", w);
  c.block_size = int_field(v, "block_size", w);
  c.n_layer = int_field(v, "n_layer", w);
  c.n_head = int_field(v, "n_head", w);
  c.n_kv_head = int_field(v, "n_kv_head", w);
  c.d_model = int_field(v, "d_model", w);
  c.ffn_hidden = int_field(v, "ffn_hidden", w);
  c.dropout = num_field(v, "dropout", w);
  c.norm_eps = num_field(v, "norm_eps", w);
  c.rope_base = num_field(v, "rope_base", w);
  c.dtype = parse_short_dtype(str_field(v, "dtype", w));
  c.seed = static_cast<uint64_t>(int_field(v, "seed", w));
  if (v.find("num_experts") != nullptr) {
    c.num_experts = int_field(v, "num_experts", w);
    c.moe_top_k = int_field(v, "moe_top_k", w);
    c.moe_ffn_hidden = int_field(v, "moe_ffn_hidden", w);
    c.moe_layer_freq = int_field(v, "moe_layer_freq", w);
    c.moe_shared_experts = int_field(v, "moe_shared_experts", w);
    c.moe_norm_topk = bool_field(v, "moe_norm_topk", w);
    c.moe_aux_loss_coeff = num_field(v, "moe_aux_loss_coeff", w);
    c.moe_z_loss_coeff = num_field(v, "moe_z_loss_coeff", w);
    c.moe_router_bias_update_rate = num_field(v, "moe_router_bias_update_rate", w);
    c.moe_capacity_factor = num_field(v, "moe_capacity_factor", w);
  }
  c.validate();
  return c;
}

json::Value scheduler_to_json(const optim::LRScheduler& s) {
  const auto& c = s.config();
  json::Value v = json::Object{};
  v.set("max_lr", c.max_lr);
  v.set("min_lr", c.min_lr);
  v.set("warmup_steps", c.warmup_steps);
  v.set("decay_steps", c.decay_steps);
  v.set("style", style_name(c.style));
  v.set("last_step", s.last_step());
  return v;
}

json::Value generator_to_json(const Generator& gen) {
  json::Value v = json::Object{};
  v.set("seed", static_cast<int64_t>(gen.seed()));
  v.set("offset", static_cast<int64_t>(gen.offset()));
  v.set("subsequence", static_cast<int64_t>(gen.subsequence()));
  return v;
}

void generator_from_json(const json::Value& v, Generator& gen) {
  const char* w = "checkpoint rng state";
  gen.set_state(static_cast<uint64_t>(int_field(v, "seed", w)),
                static_cast<uint64_t>(int_field(v, "offset", w)),
                static_cast<uint64_t>(int_field(v, "subsequence", w)));
}

// ---- saving ----

void write_model_and_optimizer(CheckpointWriter& writer, const models::GPT& model,
                               const optim::Optimizer& opt) {
  writer.write_tensors(kModelFile, model_tensors(model));

  const auto names = optimizer_param_names(model, opt);
  std::vector<std::string> by_index;  // packed index -> name
  json::Value groups = json::Array{};
  const auto sd = opt.state_dict();
  for (size_t g = 0; g < names.size(); ++g) {
    json::Value group = json::Object{};
    json::Value params = json::Array{};
    for (const auto& n : names[g]) {
      params.push_back(n);
      by_index.push_back(n);
    }
    group.set("params", std::move(params));
    group.set("lr", sd.groups[g].lr);
    group.set("weight_decay", sd.groups[g].weight_decay);
    for (const auto& [k, x] : sd.groups[g].options) group.set(k, x);
    groups.push_back(std::move(group));
  }
  NamedTensors tensors;
  json::Value steps = json::Object{};
  for (const auto& [index, ps] : sd.state) {
    const std::string& n = by_index.at(static_cast<size_t>(index));
    steps.set(n, ps.step);
    for (const auto& [k, t] : ps.tensors) tensors.emplace_back(n + "." + k, t);
  }
  json::Value meta = json::Object{};
  meta.set("name", opt.name());
  meta.set("groups", std::move(groups));
  meta.set("step", std::move(steps));
  writer.write_tensors(kOptimizerFile, tensors, {{"optimizer", json::dump(meta)}});
}

json::Value training_meta(const models::GPT& model, const optim::LRScheduler& scheduler,
                          const json::Value& extra) {
  TD_CHECK(extra.is_object(), "save_training_state: extra must be a JSON object, got ",
           json::type_name(extra.type()));
  json::Value meta = json::Object{};
  meta.set("step", scheduler.last_step());
  meta.set("config", config_to_json(model.config()));
  meta.set("scheduler", scheduler_to_json(scheduler));
  for (const auto& [k, v] : extra.as_object()) {
    TD_CHECK(meta.find(k) == nullptr, "save_training_state: extra key '", k, "' is reserved");
    meta.set(k, v);
  }
  return meta;
}

std::string save_training_state(CheckpointWriter& writer, const models::GPT& model,
                                const optim::Optimizer& optimizer,
                                const optim::LRScheduler& scheduler, const json::Value& extra) {
  json::Value meta = training_meta(model, scheduler, extra);  // checks extra before writing
  write_model_and_optimizer(writer, model, optimizer);
  return writer.commit(meta);
}

// ---- loading ----

void load_model_state(const CheckpointReader& reader, models::GPT& model) {
  check_config(reader, model);
  copy_parameters(match_parameters(reader, model));
}

TrainingState load_training_state(const CheckpointReader& reader, models::GPT& model,
                                  optim::Optimizer& opt, optim::LRScheduler& scheduler) {
  const json::Value& meta = reader.meta();
  const char* mw = "checkpoint meta.json";
  TrainingState out;
  out.step = int_field(meta, "step", mw);
  const int64_t last_step = int_field(field(meta, "scheduler", mw), "last_step", "\"scheduler\"");
  TD_CHECK(last_step >= 0, mw, ": negative scheduler last_step ", last_step);
  check_config(reader, model);
  const auto params = match_parameters(reader, model);

  // The optimizer, by name (Note [Optimizer state by name]).
  const std::string where = "checkpoint " + reader.path() + "/" + kOptimizerFile;
  SafetensorsFile f = reader.read_tensors(kOptimizerFile);
  auto mit = f.metadata.find("optimizer");
  TD_CHECK(mit != f.metadata.end(), where, ": no \"optimizer\" metadata");
  json::Value om;
  try {
    om = json::parse(mit->second);
  } catch (const Error& e) {
    TD_ERROR(where, ": the \"optimizer\" metadata is not valid JSON: ", e.what());
  }
  const std::string w = where + " metadata";
  const std::string saved_name = str_field(om, "name", w.c_str());
  TD_CHECK(saved_name == opt.name(), where, ": saved from a ", saved_name, " optimizer, this is ",
           opt.name());
  const auto names = optimizer_param_names(model, opt);
  const json::Value& groups = field(om, "groups", w.c_str());
  TD_CHECK(groups.is_array() && groups.size() == names.size(), where, ": ",
           groups.is_array() ? groups.size() : 0, " parameter groups saved, the optimizer has ",
           names.size());
  optim::OptimizerState sd;
  std::map<std::string, int64_t> index_of;  // model name -> packed index
  std::map<std::string, std::string> shape_of;
  std::map<std::string, Tensor> param_of;
  int64_t index = 0;
  for (size_t g = 0; g < names.size(); ++g) {
    const json::Value& sg = groups.as_array()[g];
    const json::Value& sp = field(sg, "params", w.c_str());
    TD_CHECK(sp.is_array(), where, ": group ", g, " \"params\" must be a list of names");
    std::set<std::string> saved, ours(names[g].begin(), names[g].end());
    for (const auto& n : sp.as_array()) {
      TD_CHECK(n.is_string(), where, ": group ", g, " \"params\" must be a list of names");
      saved.insert(n.as_string());
    }
    for (const auto& n : saved)
      TD_CHECK(ours.count(n), where, ": group ", g, " holds '", n,
               "' in the checkpoint but not in this optimizer");
    for (const auto& n : ours)
      TD_CHECK(saved.count(n), where, ": group ", g, " holds '", n,
               "' in this optimizer but not in the checkpoint");
    optim::OptimizerState::Group og;
    for (const auto& [k, v] : sg.as_object()) {
      if (k == "params") continue;
      TD_CHECK(v.is_number(), where, ": group ", g, " \"", k, "\" must be a number");
      if (k == "lr") {
        og.lr = v.as_double();
      } else if (k == "weight_decay") {
        og.weight_decay = v.as_double();
      } else {
        og.options[k] = v.as_double();
      }
    }
    const auto& group_params = opt.param_groups()[g].params;
    for (size_t i = 0; i < names[g].size(); ++i, ++index) {
      og.params.push_back(index);
      index_of[names[g][i]] = index;
      param_of[names[g][i]] = group_params[i];
    }
    sd.groups.push_back(std::move(og));
  }
  const json::Value& steps = field(om, "step", w.c_str());
  TD_CHECK(steps.is_object(), where, ": \"step\" must be an object {name: count}");
  for (const auto& [n, s] : steps.as_object()) {
    auto it = index_of.find(n);
    TD_CHECK(it != index_of.end(), where, ": step count for '", n,
             "', which is not a parameter of this optimizer");
    TD_CHECK(s.is_int(), where, ": step count for '", n, "' must be an integer");
    sd.state[it->second].step = s.as_int();
  }
  for (const auto& [tn, t] : f.tensors) {
    const size_t dot = tn.rfind('.');
    TD_CHECK(dot != std::string::npos, where, ": tensor '", tn, "' is not '<param>.<state>'");
    const std::string pn = tn.substr(0, dot);
    auto it = index_of.find(pn);
    TD_CHECK(it != index_of.end(), where, ": tensor '", tn, "' belongs to '", pn,
             "', which is not a parameter of this optimizer");
    TD_CHECK(steps.find(pn) != nullptr, where, ": tensor '", tn, "' but no step count for '", pn,
             "'");
    const Tensor& p = param_of.at(pn);
    TD_CHECK(t.sizes() == p.sizes(), where, ": tensor '", tn, "' has shape ", shape_str(t.sizes()),
             ", the parameter ", shape_str(p.sizes()));
    sd.state[it->second].tensors[tn.substr(dot + 1)] = t;
  }

  // The optimizer checks the rest (its state names) before changing anything; after it,
  // nothing can fail.
  opt.load_state_dict(sd);
  copy_parameters(params);
  scheduler.set_step(last_step);
  out.meta = meta;
  return out;
}

}  // namespace td::checkpoint
