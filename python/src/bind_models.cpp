// tardelli._C.models: GPTConfig and the fused GPT (models/gpt.h). Type conversion only; the
// torch-style wrapper (td.models.GPT, a td.nn.Module) is python/tardelli/models.py.
#include "bind.h"
#include "tardelli/models/gpt.h"

namespace td::python {

using namespace pybind11::literals;
using models::GPT;
using models::GPTConfig;

namespace {

py::list named_list(const nn::NamedTensors& ts) {
  py::list r;
  for (const auto& [n, t] : ts) r.append(py::make_tuple(n, t));
  return r;
}

py::dict moe_stats_dict(const models::MoEStats& s) {
  py::list layers;
  for (const auto& l : s.layers) {
    py::dict d;
    d["layer"] = l.layer;
    d["forwards"] = l.forwards;
    d["tokens"] = l.tokens;
    d["tokens_per_expert"] = l.tokens_per_expert;
    d["dropped"] = l.dropped;
    d["aux_loss"] = l.aux_loss;
    d["z_loss"] = l.z_loss;
    d["max_load"] = l.max_load();
    d["mean_load"] = l.mean_load();
    layers.append(d);
  }
  py::dict r;
  r["layers"] = layers;
  r["aux_loss"] = s.aux_loss();
  r["z_loss"] = s.z_loss();
  r["dropped"] = s.dropped();
  r["max_load_ratio"] = s.max_load_ratio();
  return r;
}

}  // namespace

void init_models(py::module_& m, TensorClass& /*cls*/) {
  py::module_ mm = m.def_submodule("models", "The fused GPT (C++)");

  const GPTConfig d;
  py::class_<GPTConfig>(mm, "GPTConfig")
      .def(py::init([](const std::string& arch, int64_t vocab_size, int64_t block_size,
                       int64_t n_layer, int64_t n_head, int64_t n_kv_head, int64_t d_model,
                       int64_t ffn_hidden, double dropout, double norm_eps, double rope_base,
                       DType dtype, uint64_t seed, int64_t num_experts, int64_t moe_top_k,
                       int64_t moe_ffn_hidden, int64_t moe_layer_freq, int64_t moe_shared_experts,
                       bool moe_norm_topk, double moe_aux_loss_coeff, double moe_z_loss_coeff,
                       double moe_router_bias_update_rate, double moe_capacity_factor) {
             GPTConfig c;
             c.arch = models::parse_arch(arch);
             c.vocab_size = vocab_size;
             c.block_size = block_size;
             c.n_layer = n_layer;
             c.n_head = n_head;
             c.n_kv_head = n_kv_head;
             c.d_model = d_model;
             c.ffn_hidden = ffn_hidden;
             c.dropout = dropout;
             c.norm_eps = norm_eps;
             c.rope_base = rope_base;
             c.dtype = dtype;
             c.seed = seed;
             c.num_experts = num_experts;
             c.moe_top_k = moe_top_k;
             c.moe_ffn_hidden = moe_ffn_hidden;
             c.moe_layer_freq = moe_layer_freq;
             c.moe_shared_experts = moe_shared_experts;
             c.moe_norm_topk = moe_norm_topk;
             c.moe_aux_loss_coeff = moe_aux_loss_coeff;
             c.moe_z_loss_coeff = moe_z_loss_coeff;
             c.moe_router_bias_update_rate = moe_router_bias_update_rate;
             c.moe_capacity_factor = moe_capacity_factor;
             return c;
           }),
           py::kw_only(), "arch"_a = models::arch_name(d.arch), "vocab_size"_a = d.vocab_size,
           "block_size"_a = d.block_size, "n_layer"_a = d.n_layer, "n_head"_a = d.n_head,
           "n_kv_head"_a = d.n_kv_head, "d_model"_a = d.d_model, "ffn_hidden"_a = d.ffn_hidden,
           "dropout"_a = d.dropout, "norm_eps"_a = d.norm_eps, "rope_base"_a = d.rope_base,
           "dtype"_a = d.dtype, "seed"_a = d.seed, "num_experts"_a = d.num_experts,
           "moe_top_k"_a = d.moe_top_k, "moe_ffn_hidden"_a = d.moe_ffn_hidden,
           "moe_layer_freq"_a = d.moe_layer_freq, "moe_shared_experts"_a = d.moe_shared_experts,
           "moe_norm_topk"_a = d.moe_norm_topk, "moe_aux_loss_coeff"_a = d.moe_aux_loss_coeff,
           "moe_z_loss_coeff"_a = d.moe_z_loss_coeff,
           "moe_router_bias_update_rate"_a = d.moe_router_bias_update_rate,
           "moe_capacity_factor"_a = d.moe_capacity_factor)
      .def_property(
          "arch", [](const GPTConfig& c) { return std::string(models::arch_name(c.arch)); },
          [](GPTConfig& c, const std::string& s) { c.arch = models::parse_arch(s); })
      .def_readwrite("vocab_size", &GPTConfig::vocab_size)
      .def_readwrite("block_size", &GPTConfig::block_size)
      .def_readwrite("n_layer", &GPTConfig::n_layer)
      .def_readwrite("n_head", &GPTConfig::n_head)
      .def_readwrite("n_kv_head", &GPTConfig::n_kv_head)
      .def_readwrite("d_model", &GPTConfig::d_model)
      .def_readwrite("ffn_hidden", &GPTConfig::ffn_hidden)
      .def_readwrite("dropout", &GPTConfig::dropout)
      .def_readwrite("norm_eps", &GPTConfig::norm_eps)
      .def_readwrite("rope_base", &GPTConfig::rope_base)
      .def_readwrite("dtype", &GPTConfig::dtype)
      .def_readwrite("seed", &GPTConfig::seed)
      .def_readwrite("num_experts", &GPTConfig::num_experts)
      .def_readwrite("moe_top_k", &GPTConfig::moe_top_k)
      .def_readwrite("moe_ffn_hidden", &GPTConfig::moe_ffn_hidden)
      .def_readwrite("moe_layer_freq", &GPTConfig::moe_layer_freq)
      .def_readwrite("moe_shared_experts", &GPTConfig::moe_shared_experts)
      .def_readwrite("moe_norm_topk", &GPTConfig::moe_norm_topk)
      .def_readwrite("moe_aux_loss_coeff", &GPTConfig::moe_aux_loss_coeff)
      .def_readwrite("moe_z_loss_coeff", &GPTConfig::moe_z_loss_coeff)
      .def_readwrite("moe_router_bias_update_rate", &GPTConfig::moe_router_bias_update_rate)
      .def_readwrite("moe_capacity_factor", &GPTConfig::moe_capacity_factor)
      .def("is_moe_layer", &GPTConfig::is_moe_layer, "i"_a)
      .def("kv_heads", &GPTConfig::kv_heads)
      .def("head_dim", &GPTConfig::head_dim)
      .def("ffn_hidden_size", [](const GPTConfig& c) { return models::ffn_hidden_size(c); })
      .def("validate", &GPTConfig::validate)
      .def("diff", &GPTConfig::diff, "other"_a);

  py::class_<GPT, std::shared_ptr<GPT>>(mm, "GPT")
      .def(py::init([](const GPTConfig& c) { return std::make_shared<GPT>(c); }), "config"_a,
           nogil())
      .def(py::init([](const GPTConfig& c, int64_t first_layer, int64_t num_layers, bool pre,
                       bool post) {
             return std::make_shared<GPT>(c, models::GPTStage{first_layer, num_layers, pre, post});
           }),
           "config"_a, "first_layer"_a, "num_layers"_a, "pre"_a, "post"_a, nogil())
      .def_property_readonly("stage",
                             [](const GPT& g) {
                               const auto& s = g.stage();
                               return py::make_tuple(s.first_layer, s.num_layers, s.pre, s.post);
                             })
      .def(
          "forward_stage",
          [](GPT& g, const Tensor& input, const std::optional<Tensor>& targets) {
            return g.forward_stage(input, or_undefined(targets));
          },
          "input"_a, "targets"_a = py::none(), nogil())
      .def_property_readonly("config", &GPT::config)
      .def(
          "forward",
          [](GPT& g, const Tensor& idx, const std::optional<Tensor>& targets) {
            return g.forward(idx, or_undefined(targets));
          },
          "idx"_a, "targets"_a = py::none(), nogil())
      .def(
          "generate",
          [](GPT& g, const Tensor& idx, int64_t max_new_tokens, double temperature, int64_t top_k,
             Generator* gen) { return g.generate(idx, max_new_tokens, temperature, top_k, gen); },
          "idx"_a, "max_new_tokens"_a, "temperature"_a = 1.0, "top_k"_a = 0,
          "generator"_a = nullptr, nogil())
      .def_property_readonly(
          "dropout_generator", [](GPT& g) -> Generator& { return g.dropout_generator(); },
          py::return_value_policy::reference_internal)
      .def("named_parameters", [](const GPT& g) { return named_list(g.named_parameters()); })
      .def("named_buffers", [](const GPT& g) { return named_list(g.named_buffers()); })
      .def("moe_stats", [](const GPT& g) { return moe_stats_dict(g.moe_stats()); })
      .def("reset_moe_stats", &GPT::reset_moe_stats)
      .def("take_moe_loss",
           [](GPT& g) -> std::optional<Tensor> {
             Tensor t = g.take_moe_loss();
             if (!t.defined()) return std::nullopt;
             return t;
           })
      .def(
          "set_fp8",
          [](GPT& g, int64_t history, double margin, const std::string& recipe) {
            g.set_fp8(history, margin, parse_fp8_recipe(recipe));
          },
          "history"_a = 16, "margin"_a = 0.0, "recipe"_a = "hybrid")
      .def("commit_fp8", &GPT::commit_fp8)
      .def("linear_names", &GPT::linear_names)
      .def_property_readonly("fp8", &GPT::fp8)
      .def("fp8_state",
           [](GPT& g) {
             // Per linear: [(scale, [amax...]) for input, weight, grad].
             py::list out;
             for (auto& st : g.fp8_states()) {
               py::list three;
               for (const Fp8Scaling* sc : {&st.input, &st.weight, &st.grad}) {
                 std::vector<double> h(sc->history().begin(), sc->history().end());
                 three.append(py::make_tuple(sc->scale(), h));
               }
               out.append(three);
             }
             return out;
           })
      .def(
          "load_fp8_state",
          [](GPT& g, const std::vector<std::vector<std::pair<double, std::vector<double>>>>& s) {
            auto& mine = g.fp8_states();
            TD_CHECK(s.size() == mine.size(), "GPT.load_fp8_state: ", s.size(),
                     " FP8 linears saved, this model has ", mine.size());
            for (size_t i = 0; i < s.size(); ++i) {
              TD_CHECK(s[i].size() == 3, "GPT.load_fp8_state: linear ", i, " needs 3 scalings");
              mine[i].input.set_state(s[i][0].first, s[i][0].second);
              mine[i].weight.set_state(s[i][1].first, s[i][1].second);
              mine[i].grad.set_state(s[i][2].first, s[i][2].second);
            }
          },
          "state"_a)
      .def_property_readonly("ep_size", &GPT::ep_size)
      .def_property_readonly("ep_rank", &GPT::ep_rank)
      .def("update_moe_router_bias", &GPT::update_moe_router_bias, nogil())
      .def_property(
          "moe_router_load", [](GPT& g) { return g.moe_router_load(); },
          [](GPT& g, const std::vector<std::vector<int64_t>>& load) {
            auto& mine = g.moe_router_load();
            TD_CHECK(load.size() == mine.size(), "GPT.moe_router_load: ", load.size(),
                     " layers given, this model has ", mine.size(), " MoE layers");
            for (size_t i = 0; i < load.size(); ++i)
              TD_CHECK(load[i].size() == mine[i].size(), "GPT.moe_router_load: layer ", i, " has ",
                       load[i].size(), " experts, the model's ", mine[i].size());
            mine = load;
          })
      .def(
          "set_recompute",
          [](GPT& g, const std::string& mode, int64_t num_layers) {
            g.set_recompute({models::parse_recompute(mode), num_layers});
          },
          "mode"_a, "num_layers"_a = -1)
      .def_property_readonly("recompute",
                             [](const GPT& g) {
                               return py::make_tuple(
                                   std::string(models::recompute_name(g.recompute().mode)),
                                   g.recompute().num_layers);
                             })
      .def("param_units",
           [](const GPT& g) {
             py::list r;
             for (const auto& u : g.param_units()) r.append(named_list(u));
             return r;
           })
      .def_property_readonly(
          "tp_size", [](const GPT& g) { return g.parallelism() ? g.parallelism()->tp_size() : 1; })
      .def_property_readonly(
          "cp_size", [](const GPT& g) { return g.parallelism() ? g.parallelism()->cp_size() : 1; })
      .def_property_readonly(
          "tp_rank", [](const GPT& g) { return g.parallelism() ? g.parallelism()->tp_rank() : 0; })
      .def_property_readonly("sequence_parallel",
                             [](const GPT& g) {
                               return g.parallelism() != nullptr &&
                                      g.parallelism()->sequence_parallel();
                             })
      .def_property_readonly(
          "split_generator",
          [](GPT& g) -> Generator* {
            return g.parallelism() ? &g.parallelism()->split_generator() : nullptr;
          },
          py::return_value_policy::reference_internal)
      .def(
          "shard_spec",
          [](const GPT& g, const std::string& name) {
            const nn::ShardSpec s = g.shard_spec(name);
            return py::make_tuple(s.dim, s.segments, s.parts, s.index);
          },
          "name"_a)
      .def(
          "full_shape", [](const GPT& g, const std::string& name) { return g.full_shape(name); },
          "name"_a)
      .def("named_module_types",
           [](GPT& g) {
             py::list r;
             for (auto& [n, sub] : g.named_modules()) r.append(py::make_tuple(n, sub->type_name()));
             return r;
           })
      .def("state_dict",
           [](const GPT& g) {
             py::dict r;
             for (auto& [n, t] : g.state_dict()) r[py::str(n)] = t;
             return r;
           })
      .def(
          "load_state_dict",
          [](GPT& g, const std::map<std::string, Tensor>& sd, bool strict) {
            g.load_state_dict(sd, strict);
          },
          "state_dict"_a, "strict"_a = true, nogil())
      .def(
          "param_groups",
          [](const GPT& g, double weight_decay) {
            py::list r;
            for (auto& grp : g.param_groups(weight_decay)) {
              py::dict e;
              e["params"] = named_list(grp.params);
              e["weight_decay"] = grp.weight_decay;
              r.append(e);
            }
            return r;
          },
          "weight_decay"_a)
      // Module's methods through lambdas: the nn::Module base is not a bound class.
      .def(
          "train", [](GPT& g, bool mode) { g.train(mode); }, "mode"_a = true)
      .def_property_readonly("training", [](const GPT& g) { return g.is_training(); })
      .def(
          "zero_grad", [](GPT& g, bool set_to_none) { g.zero_grad(set_to_none); },
          "set_to_none"_a = true)
      .def("num_parameters", [](const GPT& g) { return g.num_parameters(); });

  mm.def("ffn_hidden_size", &models::ffn_hidden_size, "config"_a);
  mm.attr("IGNORE_INDEX") = models::kIgnoreIndex;
}

}  // namespace td::python
