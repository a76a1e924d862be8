#pragma once
// The training configuration of `tardelli-train` and `python -m tardelli.train`: one flat set of
// named values, from defaults, then a TOML file (--config), then command-line flags, each
// overriding the one before; then checked for consistency (validate). A port of
// python/tardelli/train/config.py with the same names, defaults, flags and error texts.
//
// Note [One field table]: fields() lists every TrainConfig member once (name, type, default,
// help, choices). It drives the argv parser, the TOML loader, --help, to_json/from_json and
// fields_json (from which Python can build its argparse parser), so adding a key means adding a
// member here and a row in src/train/train_config.cpp; the build checks that the table and the
// struct have the same number of members, a test that they match config.py's fields.
//
// Note [Configuration errors]: every bad value is a ConfigError whose text is the Python CLI's,
// word for word (users see one product; tests/python assert many of them), without the
// "[check failed: ...]" suffix of TD_CHECK: it is the user's input that is wrong, not the
// code. The CLIs print "<prog>: error: <text>" and exit with status 2.
#include <array>
#include <cstdint>
#include <exception>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/core/json.h"
#include "tardelli/models/precision_policy.h"

namespace td::train {

// The program name in --help and usage lines.
inline constexpr std::string_view kProgram = "tardelli-train";

// Field names and defaults are config.py's (int -> int64_t, float -> double, str -> std::string);
// what each means: fields() or `tardelli-train --help`.
struct TrainConfig {
  // ---- model ----
  std::string arch = "gpt2";
  int64_t layers = 4;
  int64_t d_model = 256;
  int64_t heads = 4;
  int64_t kv_heads = 0;
  int64_t ffn_hidden = 0;
  int64_t seq_len = 256;
  int64_t vocab_size = 0;
  double dropout = 0.0;
  std::string dtype = "fp32";
  // ---- mixture of experts (docs/moe.md) ----
  int64_t num_experts = 0;
  int64_t moe_top_k = 2;
  int64_t moe_ffn_hidden = 0;
  int64_t moe_layer_freq = 1;
  int64_t moe_shared_experts = 0;
  double moe_aux_loss_coeff = 0.01;
  double moe_z_loss_coeff = 0.0;
  double moe_router_bias_update_rate = 0.0;
  double moe_capacity_factor = 0.0;
  // ---- batch and optimizer ----
  int64_t micro_batch_size = 8;
  int64_t global_batch_size = 0;
  int64_t steps = 1000;
  double lr = 6e-4;
  double min_lr = -1.0;
  int64_t warmup_steps = 0;
  std::string lr_decay_style = "cosine";
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double clip_grad = 1.0;
  double initial_loss_scale = 65536.0;
  int64_t loss_scale_window = 2000;
  int64_t seed = 1337;
  std::string device = "cpu";
  std::string gpu_comm = "auto";
  // ---- data ----
  std::string data;
  std::string split = "98,1,1";
  bool synthetic_data = false;
  // ---- parallelism (data parallel size = world size / (tp x cp x pp)) ----
  std::string plan;
  std::string plan_profile;
  int64_t tp = 1;
  bool sequence_parallel = false;
  int64_t make_vocab_size_divisible_by = 128;
  int64_t cp = 1;
  std::string cp_comm = "ring";
  int64_t pp = 1;
  int64_t ep = 1;
  int64_t vpp = 1;
  std::string schedule = "1f1b";
  std::string pipeline_layout;
  std::string trace;
  int64_t zero = 0;
  bool offload_optimizer = false;
  std::string recompute = "selective";
  int64_t recompute_layers = 0;
  bool hierarchical_reduce = false;
  int64_t ranks_per_node = 0;
  std::string fp8 = "none";
  int64_t fp8_amax_history = 16;
  double fp8_margin = 0.0;
  std::string precision_policy = "static";
  std::string precision_map;
  double precision_fp8_overflow = 1e-2;
  double precision_fp8_underflow = 0.05;
  double precision_fp8_error = 0.25;
  double precision_bf16_error = 0.02;
  int64_t precision_stable_steps = 100;
  std::string grad_compression = "none";
  int64_t powersgd_rank = 4;
  double topk_ratio = 0.01;
  int64_t compression_start_step = 0;
  double ddp_bucket_mb = 40.0;
  // ---- evaluation, logging, checkpoints ----
  int64_t eval_interval = 100;
  int64_t eval_steps = 10;
  int64_t log_interval = 10;
  std::string save;
  int64_t save_interval = 0;
  bool async_save = false;
  bool resume = false;
  std::string metrics_file;
  int64_t exit_interval = 0;
  bool progress = true;
  std::string inject_nonfinite_grad;
  std::string inject_nonfinite_loss;
  // ---- fault tolerance ----
  std::string on_nonfinite = "raise";
  int64_t max_skipped_steps = 5;
  double straggler_threshold = 1.2;

  // --min-lr, with its default (-1) resolved to lr / 10.
  double min_lr_value() const { return min_lr < 0 ? lr / 10 : min_lr; }
};

// A bad configuration value (Note [Configuration errors]). usage(): an error in the command line
// itself (an unknown flag, a flag without its value, a value of the wrong type or not among the
// choices): the CLI prints usage_text() before the message, as argparse does.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what, bool usage = false) : Error(what), usage_(usage) {}
  bool usage() const { return usage_; }

 private:
  bool usage_;
};

// Thrown by read_config/parse_config for -h/--help: not an error. text() is help_text(prog); the
// CLI prints it to stdout and exits with status 0 (argparse's behaviour).
class HelpRequested : public std::exception {
 public:
  explicit HelpRequested(std::string text) : text_(std::move(text)) {}
  const std::string& text() const { return text_; }
  const char* what() const noexcept override { return "help requested"; }

 private:
  std::string text_;
};

// ---- the field table (Note [One field table]) ----

enum class FieldType { Int, Float, Str, Bool };
const char* field_type_name(FieldType t);  // Python's: "int", "float", "str", "bool"

using FieldMember = std::variant<int64_t TrainConfig::*, double TrainConfig::*,
                                 std::string TrainConfig::*, bool TrainConfig::*>;

struct Field {
  std::string_view name;  // snake_case: the member, the TOML key ('-' also accepted there)
  FieldMember member;
  std::string_view help;                  // as --help shows it (a '%' is a plain '%')
  std::vector<std::string_view> choices;  // the allowed values of a str field; empty: any

  FieldType type() const { return static_cast<FieldType>(member.index()); }
  std::string flag() const;     // "--d-model"
  std::string metavar() const;  // argparse's: "D_MODEL", or "{gpt2,llama}" with choices
  json::Value get(const TrainConfig& cfg) const;  // Int, Double, String or Bool
  json::Value default_value() const;              // get(TrainConfig{})
  // Sets the member from v with config.py's coercion: an Int is accepted for a float, an
  // integral Double for an int; any other type is ConfigError
  // "<source>: '<name>' must be <type>, got <v as Python repr>".
  void set(TrainConfig& cfg, const json::Value& v, std::string_view source) const;
};

// Every field, in config.py's order.
std::span<const Field> fields();
// The field named `name` ('_' or '-' separators), or nullptr.
const Field* find_field(std::string_view name);

// cfg as {name: value} in field order: Python's TrainConfig.to_dict() (checkpoints store it).
json::Value to_json(const TrainConfig& cfg);
// Defaults updated by an object of {name: value}, each coerced as Field::set; an unknown key is
// a ConfigError. No consistency checks (validate).
TrainConfig from_json(const json::Value& values, std::string_view source = "values");
// The table for other front ends: an array of {"name", "flag", "type", "default", "help",
// "choices", "metavar"}, in field order (argparse needs each '%' of a help text doubled).
json::Value fields_json();

// ---- reading a configuration ----

// The flattened, coerced key/value pairs of a TOML config file, in file order: tables are only
// for readability; keys use the field names with '_' or '-'. ConfigError for a missing file,
// invalid TOML (naming the file, line and column), an unknown key (listing the known ones), a
// key given twice or a value of the wrong type.
json::Object load_toml(const std::string& path);

// defaults < --config FILE (load_toml) < flags, without consistency checks. argv excludes the
// program name. Flags are argparse's: --name VALUE, --name=VALUE, unique prefixes of a flag,
// bools as --flag / --no-flag, choices checked; -h/--help throws HelpRequested (help_text(prog))
// once the flags before it have been read. ConfigError (usage() true) for a bad command line.
TrainConfig read_config(const std::vector<std::string>& argv, std::string_view prog = kProgram);

// The data-parallel size of a job of world_size ranks: world_size / (tp x cp x pp); ConfigError
// when that product does not divide world_size. 1 when the product is < 1 (validate rejects it).
int64_t data_parallel_size(const TrainConfig& cfg, int64_t world_size);

// python -m tardelli.train's parse_config: read_config, then checked_config.
TrainConfig parse_config(const std::vector<std::string>& argv, int world_size = 1,
                         std::string_view prog = kProgram);
// The checks of parse_config on a configuration already read: --plan, data_parallel_size,
// validate. --plan auto is a ConfigError here: the planner is Python (docs/planner.md).
TrainConfig checked_config(TrainConfig cfg, int world_size = 1);

// Checks one configuration; ConfigError naming the offending flag(s). Runs validate_moe and
// validate_precision too. Reads the file system (--data PREFIX.idx/.bin, --precision-map) and
// asks the core for CUDA devices when --device is not cpu.
void validate(const TrainConfig& cfg, int64_t dp_size = 1);
// The mixture-of-experts keys (checked whatever --num-experts, so a typo in a dense run's MoE
// key is caught too), --ep, and the layouts the MoE model does not support yet.
void validate_moe(const TrainConfig& cfg, int64_t dp_size = 1);
// --fp8 and the per-layer precision flags (docs/fp8.md); reads --precision-map when given.
void validate_precision(const TrainConfig& cfg);

// The --precision-map file (JSON, or TOML by its .toml suffix; nested tables are dotted names)
// checked against a model of n_layer blocks (models::parse_precision_map); ConfigError naming
// the file and the entry.
std::map<std::string, models::LinearPrecision> read_precision_map(const std::string& path,
                                                                  int64_t n_layer);

// ---- help ----

std::string usage_text(std::string_view prog = kProgram);  // "usage: prog [-h] ..." + '\n'
std::string help_text(std::string_view prog = kProgram);   // usage, description, every flag

// ---- derived values for the training loop ----

// Micro-batches per optimizer step per data-parallel rank: global batch / (micro batch x dp).
int64_t accumulation_steps(const TrainConfig& cfg, int64_t dp_size = 1);
// The steps of --inject-nonfinite-grad (ConfigError when malformed).
std::set<int64_t> inject_steps(const TrainConfig& cfg);
// The items of --inject-nonfinite-loss as (step, world rank), rank -1 for every rank
// (ConfigError when malformed).
std::set<std::pair<int64_t, int>> inject_loss_steps(const TrainConfig& cfg);
// --split as (train, valid, test) ratios (ConfigError when malformed).
std::array<double, 3> split_ratios(const TrainConfig& cfg);
// --pipeline-layout as layer counts per virtual stage; empty when not given (ConfigError when
// malformed).
std::vector<int64_t> pipeline_layout_counts(const TrainConfig& cfg);

// What a resumed run must share with its checkpoint besides the model: the data order (the
// position is a sample count into the order these define). Batch sizes and the layout may change
// (Note [Layout-free checkpoints] in include/tardelli/train/train_state.h).
inline constexpr std::array<std::string_view, 5> kResumeKeys = {"seq_len", "data", "split",
                                                                "synthetic_data", "seed"};

}  // namespace td::train
