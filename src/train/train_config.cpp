#include "tardelli/train/train_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

#include "py_format.h"

namespace td::train {

namespace {

// Note [Counting the members]: TrainConfig is an aggregate, so the largest N for which
// TrainConfig{a1, ..., aN} compiles (each ai converting to any member type) is its number of
// members. The build compares it with the table's rows, so a member without a row (no flag, no
// TOML key) does not compile.
struct AnyMember {
  template <typename T>
  operator T() const;  // declared only: used in unevaluated requires-expressions
};
template <typename T, size_t... I>
constexpr bool brace_constructible(std::index_sequence<I...>) {
  return requires {
    T{(void(I), AnyMember{})...};
  };
}
template <typename T, size_t N = 0>
constexpr size_t member_count() {
  if constexpr (brace_constructible<T>(std::make_index_sequence<N + 1>())) {
    return member_count<T, N + 1>();
  } else {
    return N;
  }
}

// clang-format off
#define TD_FIELD(name, help, ...) Field{#name, &TrainConfig::name, help, {__VA_ARGS__}}
// clang-format on

// The rows, in config.py's order; help texts are config.py's as --help shows them.
const Field kFields[] = {
    TD_FIELD(arch, "gpt2 | llama", "gpt2", "llama"),
    TD_FIELD(layers, "transformer blocks"),
    TD_FIELD(d_model, "hidden size"),
    TD_FIELD(heads, "attention heads"),
    TD_FIELD(kv_heads, "key/value heads (0: = heads; llama)"),
    TD_FIELD(ffn_hidden, "MLP hidden size (0: the arch's rule)"),
    TD_FIELD(seq_len, "tokens per sample"),
    TD_FIELD(vocab_size,
             "vocabulary (0: from the dataset's tokenizer; required with --synthetic-data)"),
    TD_FIELD(dropout, "dropout probability"),
    TD_FIELD(dtype, "compute dtype: fp32 | bf16 | fp16", "fp32", "bf16", "fp16"),
    TD_FIELD(num_experts, "routed experts per MoE layer (0: a dense model)"),
    TD_FIELD(moe_top_k, "experts each token is routed to"),
    TD_FIELD(moe_ffn_hidden,
             "each expert's hidden size (0: the dense MLP's, --ffn-hidden or the arch's rule)"),
    TD_FIELD(moe_layer_freq, "block i is an MoE block iff i % F == 0 (1: every block)"),
    TD_FIELD(moe_shared_experts,
             "always-on shared experts (one dense MLP of S x the expert hidden size)"),
    TD_FIELD(moe_aux_loss_coeff, "load-balancing (Switch) loss coefficient, per MoE layer"),
    TD_FIELD(moe_z_loss_coeff, "router z-loss (ST-MoE) coefficient, per MoE layer"),
    TD_FIELD(moe_router_bias_update_rate,
             "aux-loss-free balancing (DeepSeek-V3): expert bias step after each optimizer step "
             "(0: off)"),
    TD_FIELD(moe_capacity_factor,
             "expert capacity = factor x tokens x top-k / experts, overflow dropped (0: dropless)"),
    TD_FIELD(micro_batch_size, "samples per forward/backward"),
    TD_FIELD(global_batch_size,
             "samples per optimizer step (0: micro batch x dp); larger = gradient accumulation"),
    TD_FIELD(steps, "optimizer steps to train in total"),
    TD_FIELD(lr, "peak learning rate"),
    TD_FIELD(min_lr, "final learning rate (-1: lr / 10)"),
    TD_FIELD(warmup_steps,
             "linear warmup steps (Megatron's default 0: the schedule starts at --lr)"),
    TD_FIELD(lr_decay_style, "cosine | linear | constant", "cosine", "linear", "constant"),
    TD_FIELD(weight_decay, "AdamW decoupled weight decay"),
    TD_FIELD(beta1, "AdamW beta1"),
    TD_FIELD(beta2, "AdamW beta2"),
    TD_FIELD(eps, "AdamW epsilon"),
    TD_FIELD(clip_grad, "gradient norm clip (0: off)"),
    TD_FIELD(initial_loss_scale,
             "--dtype fp16: the dynamic loss scale to start from (x0.5 on inf/nan gradients, which "
             "skip the step)"),
    TD_FIELD(loss_scale_window, "--dtype fp16: clean steps in a row before the loss scale doubles"),
    TD_FIELD(seed, "initialization, data order, dropout"),
    TD_FIELD(
        device,
        "cpu | cuda | cuda:N: where the model trains (batches are prepared on the host and copied; "
        "several ranks: each on cuda:{local rank % GPUs}, collectives as --gpu-comm says)"),
    TD_FIELD(gpu_comm,
             "several ranks on GPUs: how their groups communicate. nccl: NCCL (one rank per GPU) | "
             "host-staged: through host memory over MPI (ranks may share a GPU) | auto: nccl "
             "unless ranks share a GPU",
             "auto", "nccl", "host-staged"),
    TD_FIELD(data, "Megatron dataset prefix (PREFIX.idx/.bin)"),
    TD_FIELD(split, "train,valid,test document ratios"),
    TD_FIELD(synthetic_data, "random tokens drawn from the seed instead of a dataset"),
    TD_FIELD(
        plan,
        "auto: take tp, pp, vpp, cp, ep, the schedule, micro batch, ZeRO stage and recomputation "
        "from the planner's fastest layout for this world size (docs/planner.md); empty: as given"),
    TD_FIELD(plan_profile,
             "with --plan auto: the machine profile (default $TD_PLAN_PROFILE or "
             "~/.cache/tardelli/profile.json; python -m tardelli.plan calibrate)"),
    TD_FIELD(tp, "tensor-parallel size: each layer's matrices split over this many ranks"),
    TD_FIELD(sequence_parallel,
             "with --tp > 1: also split the activations between layers along the sequence"),
    TD_FIELD(make_vocab_size_divisible_by,
             "under --tp, pad the vocabulary to a multiple of this x tp"),
    TD_FIELD(cp, "context-parallel size: each sequence split over this many ranks (zigzag)"),
    TD_FIELD(cp_comm, "with --cp > 1: ring (ring attention) | a2a (all-to-all, Ulysses)", "ring",
             "a2a"),
    TD_FIELD(pp, "pipeline-parallel size: the layers split into this many stages"),
    TD_FIELD(ep,
             "expert-parallel size: each MoE layer's experts split over this many of the "
             "data-parallel ranks (must divide the data-parallel size)"),
    TD_FIELD(vpp, "model chunks (virtual stages) per pipeline rank (--schedule interleaved)"),
    TD_FIELD(schedule, "pipeline schedule: gpipe | 1f1b | interleaved | zb", "gpipe", "1f1b",
             "interleaved", "zb"),
    TD_FIELD(pipeline_layout, "layers per virtual stage, e.g. 3,5 (empty: even split)"),
    TD_FIELD(trace,
             "with --pp: write the last step's pipeline timeline (Chrome trace JSON) and a PNG"),
    TD_FIELD(zero,
             "ZeRO stage: 0 = replicated optimizer, 1 = optimizer state sharded over dp ranks, 2 = "
             "+ gradients sharded, 3 = + parameters sharded (FSDP); docs/memory.md"),
    TD_FIELD(offload_optimizer,
             "with --zero 1/2/3: master weights and AdamW moments in host memory, the AdamW step "
             "on the CPU"),
    TD_FIELD(recompute,
             "activation recomputation: none | selective (the MLP activation) | full (each block "
             "from its input); never changes losses (docs/memory.md)",
             "none", "selective", "full"),
    TD_FIELD(recompute_layers,
             "with --recompute full: only the first N blocks of each pipeline stage/chunk (0: "
             "every block)"),
    TD_FIELD(hierarchical_reduce,
             "two-level data-parallel reductions: inside each node first, then across nodes "
             "(docs/distributed.md)"),
    TD_FIELD(ranks_per_node,
             "ranks per node for --hierarchical-reduce (0: from the launcher's environment, else "
             "one node); set it to simulate nodes on one machine"),
    TD_FIELD(fp8,
             "FP8 linears in the blocks, emulated: none | hybrid (E4M3 forward, E5M2 gradients) | "
             "e4m3 (every tensor in E4M3); docs/fp8.md",
             "none", "hybrid", "e4m3"),
    TD_FIELD(fp8_amax_history,
             "--fp8: steps of amax history for delayed scaling (0: current scaling)"),
    TD_FIELD(fp8_margin, "--fp8: scales are fp8_max / amax / 2^margin"),
    TD_FIELD(precision_policy,
             "per-layer precision of the block linears: static (--fp8 / --precision-map) | "
             "adaptive (each starts at fp8, or bf16 without --fp8, and is promoted to bf16 / fp32 "
             "when its statistics cross the --precision-* thresholds; docs/fp8.md)",
             "static", "adaptive"),
    TD_FIELD(precision_map,
             "JSON or TOML file mapping block linears (h.3.mlp.c_fc or blocks.3.mlp_in) to fp8 | "
             "bf16 | fp32; under adaptive, each entry is that linear's lowest precision"),
    TD_FIELD(
        precision_fp8_overflow,
        "adaptive: promote an fp8 linear when this fraction of its quantized values saturates"),
    TD_FIELD(precision_fp8_underflow,
             "adaptive: promote an fp8 linear when this fraction of its quantized values flushes "
             "to zero"),
    TD_FIELD(
        precision_fp8_error,
        "adaptive: promote an fp8 linear when its output's relative error vs fp32 exceeds this"),
    TD_FIELD(precision_bf16_error,
             "adaptive: promote a bf16 linear to fp32 when its output's relative error vs fp32 "
             "exceeds this"),
    TD_FIELD(precision_stable_steps,
             "adaptive: demote a promoted linear after this many steps within half the lower "
             "precision's thresholds"),
    TD_FIELD(grad_compression,
             "compressed data-parallel gradients with error feedback: none | powersgd | topk | "
             "randomk (docs/distributed.md)",
             "none", "powersgd", "topk", "randomk"),
    TD_FIELD(powersgd_rank, "PowerSGD's rank (every matrix's dimensions must be at least this)"),
    TD_FIELD(topk_ratio,
             "top-k / random-k: the fraction of each bucket's entries a rank sends, in (0, 1]"),
    TD_FIELD(compression_start_step,
             "with --grad-compression: the first N steps reduce uncompressed (PyTorch's "
             "start_powerSGD_iter; Note [Compression warm-up])"),
    TD_FIELD(ddp_bucket_mb, "gradient bucket size for overlapped data-parallel reduction (MB)"),
    TD_FIELD(eval_interval, "steps between evaluations (0: off)"),
    TD_FIELD(eval_steps, "validation micro-batches per eval"),
    TD_FIELD(log_interval, "steps between log lines"),
    TD_FIELD(save, "checkpoint root directory"),
    TD_FIELD(save_interval, "steps between checkpoints (0: only at the end)"),
    TD_FIELD(async_save,
             "write checkpoints in a background thread: the step only copies the state to host "
             "memory (docs/checkpoints.md)"),
    TD_FIELD(resume, "continue from the latest checkpoint under --save"),
    TD_FIELD(metrics_file, "JSON lines, one per step"),
    TD_FIELD(exit_interval,
             "stop (after saving) once the step count is a multiple of this (0: off)"),
    TD_FIELD(progress, "show a progress bar"),
    TD_FIELD(inject_nonfinite_grad,
             "testing aid: comma-separated steps (1-based) whose backward is seeded with inf on "
             "every rank, so their gradients are non-finite (exercises fp16 step skipping)"),
    TD_FIELD(inject_nonfinite_loss,
             "testing aid: comma-separated STEP or STEP@RANK (1-based steps, RANK a world rank; "
             "default every rank) whose loss is reported as nan on that rank while the gradients "
             "stay finite (exercises --on-nonfinite)"),
    TD_FIELD(on_nonfinite,
             "a step whose loss or gradient norm is inf/nan on any rank: raise (stop with an error "
             "naming the step) | skip (discard its update; the step still counts)",
             "raise", "skip"),
    TD_FIELD(
        max_skipped_steps,
        "with --on-nonfinite skip: stop with an error after this many consecutive skipped steps"),
    TD_FIELD(straggler_threshold,
             "log a rank whose step compute time exceeds this ratio x the median over ranks (at "
             "most once per --log-interval steps; 0: off)"),
};

#undef TD_FIELD

static_assert(std::size(kFields) == member_count<TrainConfig>(),
              "every TrainConfig member needs a row in kFields (Note [One field table])");

}  // namespace

const char* field_type_name(FieldType t) {
  switch (t) {
    case FieldType::Int:
      return "int";
    case FieldType::Float:
      return "float";
    case FieldType::Str:
      return "str";
    case FieldType::Bool:
      return "bool";
  }
  return "?";
}

std::span<const Field> fields() {
  return kFields;
}

const Field* find_field(std::string_view name) {
  std::string key(name);
  std::replace(key.begin(), key.end(), '-', '_');
  for (const Field& f : kFields) {
    if (f.name == key) return &f;
  }
  return nullptr;
}

std::string Field::flag() const {
  std::string out = "--" + std::string(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

std::string Field::metavar() const {
  if (choices.empty()) {
    std::string out(name);
    for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
  }
  std::string out = "{";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) out += ',';
    out += choices[i];
  }
  return out + "}";
}

json::Value Field::get(const TrainConfig& cfg) const {
  return std::visit([&](auto m) { return json::Value(cfg.*m); }, member);
}

json::Value Field::default_value() const {
  return get(TrainConfig{});
}

void Field::set(TrainConfig& cfg, const json::Value& v, std::string_view source) const {
  auto wrong = [&]() {
    return ConfigError(detail::str_cat(source, ": '", name, "' must be ", field_type_name(type()),
                                       ", got ", py::repr(v)));
  };
  switch (type()) {
    case FieldType::Int: {
      int64_t x = 0;
      if (v.is_int()) {
        x = v.as_int();
      } else if (v.is_double() && std::isfinite(v.as_double()) &&
                 v.as_double() == std::floor(v.as_double()) &&
                 std::fabs(v.as_double()) < 9.2233720368547758e18) {
        x = static_cast<int64_t>(v.as_double());  // config.py: an integral float is an int
      } else {
        throw wrong();
      }
      cfg.*std::get<int64_t TrainConfig::*>(member) = x;
      return;
    }
    case FieldType::Float:
      if (!v.is_number()) throw wrong();
      cfg.*std::get<double TrainConfig::*>(member) = v.as_double();  // an int converts
      return;
    case FieldType::Str:
      if (!v.is_string()) throw wrong();
      cfg.*std::get<std::string TrainConfig::*>(member) = v.as_string();
      return;
    case FieldType::Bool:
      if (!v.is_bool()) throw wrong();
      cfg.*std::get<bool TrainConfig::*>(member) = v.as_bool();
      return;
  }
}

json::Value to_json(const TrainConfig& cfg) {
  json::Value out = json::Object{};
  for (const Field& f : kFields) out.set(std::string(f.name), f.get(cfg));
  return out;
}

TrainConfig from_json(const json::Value& values, std::string_view source) {
  if (!values.is_object()) {
    throw ConfigError(detail::str_cat(source, ": expected an object of configuration keys, got ",
                                      py::repr(values)));
  }
  TrainConfig cfg;
  for (const auto& [key, v] : values.as_object()) {
    const Field* f = find_field(key);
    if (f == nullptr) throw ConfigError(detail::str_cat(source, ": unknown key '", key, "'"));
    f->set(cfg, v, source);
  }
  return cfg;
}

json::Value fields_json() {
  json::Value out = json::Array{};
  for (const Field& f : kFields) {
    json::Value row = json::Object{};
    row.set("name", std::string(f.name));
    row.set("flag", f.flag());
    row.set("type", field_type_name(f.type()));
    row.set("default", f.default_value());
    row.set("help", std::string(f.help));
    json::Value choices = json::Array{};
    for (std::string_view c : f.choices) choices.push_back(std::string(c));
    row.set("choices", std::move(choices));
    row.set("metavar", f.metavar());
    out.push_back(std::move(row));
  }
  return out;
}

// ---- derived values ----

int64_t accumulation_steps(const TrainConfig& cfg, int64_t dp_size) {
  const int64_t per_step = cfg.micro_batch_size * dp_size;
  TD_CHECK(per_step > 0, "accumulation_steps: micro batch x dp must be > 0, got ",
           cfg.micro_batch_size, " x ", dp_size);
  const int64_t gbs = cfg.global_batch_size ? cfg.global_batch_size : per_step;
  return gbs / per_step;
}

std::set<int64_t> inject_steps(const TrainConfig& cfg) {
  std::set<int64_t> out;
  for (std::string_view item : py::split(cfg.inject_nonfinite_grad, ',')) {
    if (py::strip(item).empty()) continue;
    const auto step = py::parse_int(item);
    if (!step) {
      throw ConfigError(
          "--inject-nonfinite-grad must list step numbers >= 1 separated by commas, got " +
          py::repr(cfg.inject_nonfinite_grad));
    }
    out.insert(*step);
  }
  return out;
}

std::set<std::pair<int64_t, int>> inject_loss_steps(const TrainConfig& cfg) {
  std::set<std::pair<int64_t, int>> out;
  for (std::string_view item : py::split(cfg.inject_nonfinite_loss, ',')) {
    if (py::strip(item).empty()) continue;
    const size_t at = item.find('@');  // Python's str.partition("@")
    const auto step = py::parse_int(item.substr(0, at));
    std::optional<int64_t> rank = -1;
    if (at != std::string_view::npos) rank = py::parse_int(item.substr(at + 1));
    if (!step || !rank || (at != std::string_view::npos && *rank < 0) ||
        *rank > std::numeric_limits<int>::max()) {
      throw ConfigError(
          "--inject-nonfinite-loss must list STEP or STEP@RANK (steps >= 1, ranks >= 0) "
          "separated by commas, got " +
          py::repr(cfg.inject_nonfinite_loss));
    }
    out.emplace(*step, static_cast<int>(*rank));
  }
  return out;
}

std::array<double, 3> split_ratios(const TrainConfig& cfg) {
  const auto parts = py::split(cfg.split, ',');
  std::array<double, 3> out{};
  bool ok = parts.size() == 3;
  for (size_t i = 0; ok && i < 3; ++i) {
    const auto r = py::parse_float(parts[i]);
    ok = r.has_value();
    if (ok) out[i] = *r;
  }
  if (!ok) {
    throw ConfigError(
        "--split must be three non-negative ratios with train > 0, e.g. 98,1,1; got " +
        py::repr(cfg.split));
  }
  return out;
}

std::vector<int64_t> pipeline_layout_counts(const TrainConfig& cfg) {
  std::vector<int64_t> out;
  if (cfg.pipeline_layout.empty()) return out;
  for (std::string_view item : py::split(cfg.pipeline_layout, ',')) {
    const auto n = py::parse_int(item);
    if (!n) {
      throw ConfigError("--pipeline-layout " + py::repr(cfg.pipeline_layout) +
                        " must list layer counts separated by commas");
    }
    out.push_back(*n);
  }
  return out;
}

}  // namespace td::train
