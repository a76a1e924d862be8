// The consistency checks of a TrainConfig: config.py's validate, validate_moe and
// validate_precision, rule for rule and in the same order, with the same texts
// (Note [Configuration errors] in train/train_config.h).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "py_format.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/train/train_config.h"

namespace td::train {

namespace {

using detail::str_cat;

void need(bool ok, const std::string& message) {
  if (!ok) throw ConfigError(message);
}

std::string flag_name(std::string_view name) {
  std::string out = "--" + std::string(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

int64_t int_field(const TrainConfig& cfg, std::string_view name) {
  return find_field(name)->get(cfg).as_int();
}

double float_field(const TrainConfig& cfg, std::string_view name) {
  return find_field(name)->get(cfg).as_double();
}

template <typename F>
auto parsed(F&& f) -> std::optional<decltype(f())> {
  try {
    return f();
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

}  // namespace

void validate(const TrainConfig& cfg, int64_t dp_size) {
  TD_CHECK(dp_size >= 1, "validate: the data-parallel size must be >= 1, got ", dp_size);
  for (const Field& f : fields()) {
    if (f.choices.empty()) continue;
    const std::string v = f.get(cfg).as_string();
    const std::string names = py::join(", ", f.choices);
    need(std::find(f.choices.begin(), f.choices.end(), v) != f.choices.end(),
         str_cat(f.flag(), ": unknown value ", py::repr(v), " (choose from ", names, ")"));
  }
  for (std::string_view name :
       {"layers", "d_model", "heads", "seq_len", "micro_batch_size", "steps"}) {
    const int64_t v = int_field(cfg, name);
    need(v > 0, str_cat(flag_name(name), " must be > 0, got ", v));
  }
  for (std::string_view name :
       {"kv_heads", "ffn_hidden", "vocab_size", "global_batch_size", "warmup_steps",
        "eval_interval", "eval_steps", "save_interval", "exit_interval"}) {
    const int64_t v = int_field(cfg, name);
    need(v >= 0, str_cat(flag_name(name), " must be >= 0, got ", v));
  }
  need(cfg.zero >= 0 && cfg.zero <= 3, str_cat("--zero must be 0, 1, 2 or 3, got ", cfg.zero));
  need(!cfg.offload_optimizer || cfg.zero >= 1,
       "--offload-optimizer needs --zero 1, 2 or 3: the offloaded state is the sharded "
       "distributed optimizer's (as in DeepSpeed and Megatron)");
  need(cfg.zero < 2 || cfg.schedule != "zb",
       str_cat("--zero ", cfg.zero,
               " with --schedule zb is not supported yet (the deferred weight gradients would "
               "arrive after the per-micro-batch gradient reduce-scatter)"));
  need(cfg.device == "cpu" || cfg.device == "cuda" || cfg.device.starts_with("cuda:"),
       "--device: expected cpu, cuda or cuda:N, got " + py::repr(cfg.device));
  if (cfg.device != "cpu") {
    need(cuda_available(), str_cat("--device ", cfg.device,
                                   ": no CUDA device is available (td.cuda.device_count() == 0; "
                                   "this build has the CUDA backend: ",
                                   py::str(cuda_is_built()), ")"));
    need(cfg.ep == 1,
         str_cat("--device ", cfg.device, " with --ep ", cfg.ep,
                 ": expert parallelism runs on CPU ranks only for now (its routing reads the "
                 "router's choices back to the host; data, tensor, sequence, context and "
                 "pipeline parallelism and ZeRO run on GPUs)"));
  }
  need(cfg.tp >= 1, str_cat("--tp must be >= 1, got ", cfg.tp));
  need(!cfg.sequence_parallel || cfg.tp > 1,
       "--sequence-parallel needs tensor parallelism (--tp > 1)");
  need(cfg.make_vocab_size_divisible_by >= 1,
       str_cat("--make-vocab-size-divisible-by must be >= 1, got ",
               cfg.make_vocab_size_divisible_by));
  need(cfg.pp >= 1 && cfg.vpp >= 1,
       str_cat("--pp and --vpp must be >= 1, got ", cfg.pp, ", ", cfg.vpp));
  need(cfg.vpp == 1 || cfg.schedule == "interleaved",
       str_cat("--vpp ", cfg.vpp, " needs --schedule interleaved"));
  need(cfg.schedule != "interleaved" || cfg.vpp >= 2,
       "--schedule interleaved needs --vpp >= 2 model chunks per rank");
  // The smallest stage (model chunk) and its layer count, for --recompute-layers.
  const int64_t stages = cfg.pp * cfg.vpp;
  int64_t fewest = 0, fewest_layers = 0;
  if (!cfg.pipeline_layout.empty()) {
    const auto counts =
        parsed([&] { return pipeline_layout_counts(cfg); }).value_or(std::vector<int64_t>{});
    int64_t sum = 0;
    for (int64_t c : counts) sum += c;
    need(static_cast<int64_t>(counts.size()) == stages &&
             std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c >= 1; }) &&
             sum == cfg.layers,
         str_cat("--pipeline-layout ", py::repr(cfg.pipeline_layout), " must list ", stages,
                 " positive layer counts (--pp x --vpp) summing to --layers ", cfg.layers));
    fewest = std::min_element(counts.begin(), counts.end()) - counts.begin();
    fewest_layers = counts[static_cast<size_t>(fewest)];
  } else {
    need(cfg.layers % stages == 0,
         str_cat("--layers ", cfg.layers, " is not divisible by --pp ", cfg.pp, " x --vpp ",
                 cfg.vpp, " (or give --pipeline-layout)"));
    fewest_layers = cfg.layers / stages;  // every stage holds as many
  }
  need(cfg.recompute_layers >= 0,
       str_cat("--recompute-layers must be >= 0, got ", cfg.recompute_layers));
  need(cfg.recompute_layers == 0 || cfg.recompute == "full",
       str_cat("--recompute-layers ", cfg.recompute_layers,
               " selects blocks for full recomputation: it needs --recompute full (got "
               "--recompute ",
               cfg.recompute, ")"));
  if (cfg.recompute_layers) {
    // Every stage (model chunk) recomputes its first N blocks (Megatron's block method), so N
    // must fit in the smallest one.
    need(cfg.recompute_layers <= fewest_layers,
         str_cat("--recompute-layers ", cfg.recompute_layers, " exceeds the ", fewest_layers,
                 " layers of pipeline stage ", fewest, " (--layers ", cfg.layers, ", --pp ", cfg.pp,
                 ", --vpp ", cfg.vpp,
                 cfg.pipeline_layout.empty() ? "" : ", --pipeline-layout " + cfg.pipeline_layout,
                 "): full recomputation applies to the first N blocks of every stage"));
  }
  need(cfg.cp >= 1, str_cat("--cp must be >= 1, got ", cfg.cp));
  const int64_t kv = cfg.kv_heads ? cfg.kv_heads : cfg.heads;
  if (cfg.cp > 1) {
    need(cfg.seq_len % (2 * cfg.cp) == 0,
         str_cat("--cp ", cfg.cp, ": --seq-len ", cfg.seq_len, " must be divisible by 2 x cp = ",
                 2 * cfg.cp, " (the zigzag layout cuts each sequence into 2 x cp chunks)"));
    need(!cfg.sequence_parallel || (cfg.seq_len / cfg.cp) % cfg.tp == 0,
         str_cat("--sequence-parallel with --cp ", cfg.cp, ": --tp ", cfg.tp,
                 " does not divide each cp rank's ", cfg.seq_len / cfg.cp, " tokens"));
    need(
        cfg.cp_comm != "a2a" || (cfg.heads % (cfg.tp * cfg.cp) == 0 && kv % (cfg.tp * cfg.cp) == 0),
        str_cat("--cp-comm a2a splits heads over tp x cp = ", cfg.tp * cfg.cp, ": --heads ",
                cfg.heads, " and the ", kv,
                " key/value heads must be divisible by it (or use --cp-comm ring)"));
    need(cfg.device == "cpu", str_cat("--cp ", cfg.cp,
                                      ": context parallelism runs on the CPU (MPI) backend for "
                                      "now"));
    need(cfg.zero < 2, str_cat("--zero ", cfg.zero, " with --cp ", cfg.cp,
                               ": ZeRO-2/3 over the dp x cp group is not supported yet (use "
                               "--zero 0 or 1)"));
  }
  if (cfg.tp > 1) {
    need(cfg.heads % cfg.tp == 0, str_cat("--tp ", cfg.tp, " does not divide --heads ", cfg.heads,
                                          " (attention splits heads)"));
    need(kv % cfg.tp == 0,
         str_cat("--tp ", cfg.tp, " does not divide the ", kv,
                 " key/value heads (--kv-heads; grouped-query attention splits them too)"));
    need(cfg.cp > 1 || !cfg.sequence_parallel || cfg.seq_len % cfg.tp == 0,
         str_cat("--sequence-parallel: --tp ", cfg.tp, " does not divide --seq-len ", cfg.seq_len));
  }
  validate_moe(cfg, dp_size);
  need(cfg.ddp_bucket_mb > 0,
       str_cat("--ddp-bucket-mb must be > 0, got ", py::str(cfg.ddp_bucket_mb)));
  need(
      cfg.ranks_per_node >= 0,
      str_cat("--ranks-per-node must be >= 0 (0: from the environment), got ", cfg.ranks_per_node));
  need(cfg.fp8_amax_history >= 0,
       str_cat("--fp8-amax-history must be >= 0, got ", cfg.fp8_amax_history));
  need(std::isfinite(cfg.fp8_margin) && cfg.fp8_margin >= 0,
       str_cat("--fp8-margin must be >= 0, got ", py::str(cfg.fp8_margin)));
  validate_precision(cfg);
  need(cfg.powersgd_rank >= 1, str_cat("--powersgd-rank must be >= 1, got ", cfg.powersgd_rank));
  need(cfg.topk_ratio > 0 && cfg.topk_ratio <= 1,
       str_cat("--topk-ratio must be in (0, 1], got ", py::str(cfg.topk_ratio)));
  need(cfg.compression_start_step >= 0,
       str_cat("--compression-start-step must be >= 0, got ", cfg.compression_start_step));
  need(cfg.compression_start_step == 0 || cfg.grad_compression != "none",
       "--compression-start-step applies to --grad-compression");
  need(cfg.grad_compression == "none" || cfg.zero < 2,
       str_cat("--grad-compression ", cfg.grad_compression, " with --zero ", cfg.zero,
               ": compression works with all-reduced (--zero 0) and ZeRO-1 gradients, not "
               "ZeRO-2/3 shards"));
  need(cfg.ranks_per_node == 0 || cfg.hierarchical_reduce,
       "--ranks-per-node applies to --hierarchical-reduce");
  need(cfg.log_interval > 0, str_cat("--log-interval must be > 0, got ", cfg.log_interval));
  need(cfg.trace.empty() || cfg.pp > 1, "--trace records the pipeline timeline: it needs --pp > 1");
  need(cfg.d_model % cfg.heads == 0,
       str_cat("--heads ", cfg.heads, " does not divide --d-model ", cfg.d_model));
  need(cfg.heads % kv == 0, str_cat("--kv-heads ", kv, " does not divide --heads ", cfg.heads));
  need(cfg.arch == "llama" || kv == cfg.heads,
       str_cat("--kv-heads ", cfg.kv_heads, ": grouped-query attention needs --arch llama"));
  need(cfg.dropout >= 0.0 && cfg.dropout < 1.0,
       str_cat("--dropout must be in [0, 1), got ", py::str(cfg.dropout)));
  need(cfg.lr > 0, str_cat("--lr must be > 0, got ", py::str(cfg.lr)));
  need(cfg.min_lr_value() <= cfg.lr,
       str_cat("--min-lr ", py::str(cfg.min_lr), " is larger than --lr ", py::str(cfg.lr)));
  need(cfg.warmup_steps <= cfg.steps,
       str_cat("--warmup-steps ", cfg.warmup_steps, " exceeds --steps ", cfg.steps));
  need(cfg.weight_decay >= 0,
       str_cat("--weight-decay must be >= 0, got ", py::str(cfg.weight_decay)));
  need(cfg.beta1 >= 0 && cfg.beta1 < 1 && cfg.beta2 >= 0 && cfg.beta2 < 1,
       str_cat("--beta1/--beta2 must be in [0, 1), got ", py::str(cfg.beta1), ", ",
               py::str(cfg.beta2)));
  need(cfg.clip_grad >= 0, str_cat("--clip-grad must be >= 0, got ", py::str(cfg.clip_grad)));
  need(std::isfinite(cfg.initial_loss_scale) && cfg.initial_loss_scale > 0,
       str_cat("--initial-loss-scale must be a positive number, got ",
               py::str(cfg.initial_loss_scale)));
  need(cfg.loss_scale_window >= 1,
       str_cat("--loss-scale-window must be >= 1, got ", cfg.loss_scale_window));
  const auto grad_steps = parsed([&] { return inject_steps(cfg); });
  need(grad_steps &&
           std::all_of(grad_steps->begin(), grad_steps->end(), [](int64_t s) { return s >= 1; }),
       "--inject-nonfinite-grad must list step numbers >= 1 separated by commas, got " +
           py::repr(cfg.inject_nonfinite_grad));
  const auto loss_steps = parsed([&] { return inject_loss_steps(cfg); });
  need(loss_steps && std::all_of(loss_steps->begin(), loss_steps->end(),
                                 [](const auto& s) { return s.first >= 1; }),
       "--inject-nonfinite-loss must list STEP or STEP@RANK (steps >= 1, ranks >= 0) "
       "separated by commas, got " +
           py::repr(cfg.inject_nonfinite_loss));
  need(cfg.max_skipped_steps >= 1,
       str_cat("--max-skipped-steps must be >= 1, got ", cfg.max_skipped_steps));
  need(std::isfinite(cfg.straggler_threshold) &&
           (cfg.straggler_threshold == 0 || cfg.straggler_threshold >= 1),
       str_cat("--straggler-threshold must be 0 (off) or a ratio >= 1, got ",
               py::str(cfg.straggler_threshold)));
  const int64_t per_step = cfg.micro_batch_size * dp_size;
  const int64_t gbs = cfg.global_batch_size ? cfg.global_batch_size : per_step;
  need(gbs % per_step == 0,
       str_cat("--global-batch-size ", gbs, " is not a multiple of --micro-batch-size ",
               cfg.micro_batch_size, " x data-parallel size ", dp_size));
  if (cfg.pp > 1 && gbs % per_step == 0) {
    const int64_t m = gbs / per_step;
    need(cfg.schedule != "interleaved" || (m >= cfg.pp && m % cfg.pp == 0),
         str_cat("--schedule interleaved: the ", m,
                 " micro-batches per step (global batch / (micro batch x dp)) must be a "
                 "multiple of --pp ",
                 cfg.pp, " and at least ", cfg.pp));
  }
  need(cfg.data.empty() == cfg.synthetic_data,
       cfg.data.empty() ? "give exactly one data source: --data PREFIX or --synthetic-data"
                        : "--data and --synthetic-data exclude each other");
  if (cfg.synthetic_data) {
    need(cfg.vocab_size > 0, "--synthetic-data needs --vocab-size");
  } else {
    for (const char* ext : {".idx", ".bin"}) {
      std::error_code ec;
      need(std::filesystem::is_regular_file(cfg.data + ext, ec),
           str_cat("--data ", cfg.data, ": ", cfg.data + ext,
                   " not found (make it with python -m tardelli.data.preprocess)"));
    }
  }
  const auto ratios = parsed([&] { return split_ratios(cfg); });
  need(ratios && std::all_of(ratios->begin(), ratios->end(), [](double r) { return r >= 0; }) &&
           (*ratios)[0] > 0,
       "--split must be three non-negative ratios with train > 0, e.g. 98,1,1; got " +
           py::repr(cfg.split));
  need(!cfg.resume || !cfg.save.empty(), "--resume needs --save DIR (where the checkpoints are)");
  need(!cfg.async_save || !cfg.save.empty(), "--async-save needs --save DIR");
}

void validate_moe(const TrainConfig& cfg, int64_t dp_size) {
  need(cfg.num_experts >= 0,
       str_cat("--num-experts must be >= 0 (0: dense), got ", cfg.num_experts));
  for (std::string_view name : {"moe_ffn_hidden", "moe_shared_experts"}) {
    const int64_t v = int_field(cfg, name);
    need(v >= 0, str_cat(flag_name(name), " must be >= 0, got ", v));
  }
  need(cfg.moe_layer_freq >= 1, str_cat("--moe-layer-freq must be >= 1, got ", cfg.moe_layer_freq));
  for (std::string_view name : {"moe_aux_loss_coeff", "moe_z_loss_coeff",
                                "moe_router_bias_update_rate", "moe_capacity_factor"}) {
    const double v = float_field(cfg, name);
    need(std::isfinite(v) && v >= 0,
         str_cat(flag_name(name), " must be a number >= 0, got ", py::str(v)));
  }
  need(cfg.ep >= 1, str_cat("--ep must be >= 1, got ", cfg.ep));
  need(cfg.ep == 1 || cfg.num_experts > 0,
       str_cat("--ep ", cfg.ep,
               ": expert parallelism needs a mixture-of-experts model (--num-experts)"));
  if (cfg.num_experts == 0) return;
  need(cfg.moe_top_k >= 1 && cfg.moe_top_k <= cfg.num_experts,
       str_cat("--moe-top-k ", cfg.moe_top_k, " must be in [1, --num-experts ", cfg.num_experts,
               "]"));
  need(cfg.num_experts % cfg.ep == 0,
       str_cat("--num-experts ", cfg.num_experts, " is not divisible by --ep ", cfg.ep,
               " (each ep rank holds num_experts / ep experts)"));
  need(dp_size % cfg.ep == 0,
       str_cat("--ep ", cfg.ep, " does not divide the data-parallel size ", dp_size,
               " (ranks / (tp x cp x pp)): the ep ranks are data-parallel ranks of the dense "
               "layers"));
  need(cfg.ep == 1 || cfg.zero < 3,
       str_cat("--ep ", cfg.ep,
               " with --zero 3: sharding the experts over their expert-data-parallel group is "
               "not supported yet (use --zero 0, 1 or 2)"));
  need(!cfg.sequence_parallel,
       str_cat("--num-experts ", cfg.num_experts,
               " with --sequence-parallel: the MoE layers run on whole sequences under --tp "
               "(drop --sequence-parallel)"));
  need(cfg.cp == 1, str_cat("--num-experts ", cfg.num_experts, " with --cp ", cfg.cp,
                            ": the MoE layers do not support context parallelism yet (use "
                            "--cp 1)"));
}

void validate_precision(const TrainConfig& cfg) {
  for (std::string_view k : {"fp8_overflow", "fp8_underflow", "fp8_error", "bf16_error"}) {
    const double v = float_field(cfg, "precision_" + std::string(k));
    need(std::isfinite(v) && v >= 0,
         str_cat("--precision-", flag_name(k).substr(2), " must be >= 0, got ", py::str(v)));
  }
  need(cfg.precision_stable_steps >= 1,
       str_cat("--precision-stable-steps must be >= 1, got ", cfg.precision_stable_steps));
  if (cfg.precision_policy == "adaptive" || !cfg.precision_map.empty()) {
    const char* flag =
        cfg.precision_policy == "adaptive" ? "--precision-policy adaptive" : "--precision-map";
    need(cfg.zero < 3, str_cat(flag,
                               " with --zero 3: bf16/fp32 linears and the statistics need the "
                               "fp32 weights, which ZeRO-3 releases between uses"));
  }
  if (!cfg.precision_map.empty()) {
    std::string first_fp8;  // the map is sorted by name, as config.py's sorted() list
    for (const auto& [name, p] : read_precision_map(cfg.precision_map, cfg.layers)) {
      if (p == models::LinearPrecision::FP8) {
        first_fp8 = name;
        break;
      }
    }
    need(first_fp8.empty() || cfg.fp8 != "none",
         str_cat("--precision-map ", cfg.precision_map, ": entry '", first_fp8,
                 "' is fp8 but --fp8 is none"));
  }
}

}  // namespace td::train
