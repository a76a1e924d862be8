#pragma once
// The training-state layout of a checkpoint step directory, shared by the Python CLI and the C++
// trainer (docs/checkpoints.md is the reference):
//
//   model.safetensors      every parameter by its GPT name ("h.0.attn.c_attn.weight"), as stored
//                          (fp32 master weights); tied weights once (named_parameters()); then
//                          the buffers (named_buffers(): the MoE routers' expert_bias).
//   optimizer.safetensors  "<param name>.<state>" for each parameter with state (AdamW:
//                          exp_avg, exp_avg_sq); __metadata__ "optimizer" = JSON text
//                          {"name": "AdamW", "groups": [{"params": [names], "lr", "weight_decay",
//                          <options: "beta1", "beta2", "eps">}], "step": {name: count}}
//   meta.json              {"step", "config": {every GPTConfig field; the moe_* ones only
//                          when num_experts > 0}, "scheduler": {"max_lr",
//                          "min_lr", "warmup_steps", "decay_steps", "style", "last_step"},
//                          ...the caller's extra members: "data", "rng", "train"}
//
// Note [Optimizer state by name]: the optimizer's packed indices depend on how its groups were
// built; names do not. Saving maps each optimizer parameter to its model name by tensor
// identity; loading maps back, so a resumed run may build its groups in another order, as long
// as each group holds the same set of parameters as the saved group of the same position.
#include <cstdint>
#include <string>

#include "tardelli/checkpoint/checkpoint.h"
#include "tardelli/core/json.h"
#include "tardelli/models/gpt.h"
#include "tardelli/optim/lr_schedule.h"
#include "tardelli/optim/optimizer.h"

namespace td::checkpoint {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";

// GPTConfig <-> meta.json's "config": every field; arch "gpt2"/"llama", dtype
// "fp32"/"bf16"/"fp16", seed as an integer. from_json: td::Error naming a missing or mistyped
// field; the result is validated.
json::Value config_to_json(const models::GPTConfig& config);
models::GPTConfig config_from_json(const json::Value& v);
// "fp32" | "bf16" | "fp16" <-> DType (td::Error for other names or dtypes).
const char* short_dtype_name(DType dtype);
DType parse_short_dtype(const std::string& name);

// meta.json's "scheduler" object.
json::Value scheduler_to_json(const optim::LRScheduler& scheduler);

// A Generator's state as meta.json's "rng" entries store it: {"seed", "offset", "subsequence"}
// (integers; the uint64 bit patterns). By convention "rng" holds "dropout" (the model's
// dropout_generator()) and, where a trainer uses it, "default" (td::default_generator()).
json::Value generator_to_json(const Generator& gen);
void generator_from_json(const json::Value& v, Generator& gen);  // td::Error naming a bad field

// The pieces of save_training_state, for writers that add files or shard (Note [Sharded saving]):
// writes model.safetensors and optimizer.safetensors through `writer`.
void write_model_and_optimizer(CheckpointWriter& writer, const models::GPT& model,
                               const optim::Optimizer& optimizer);
// {"step": scheduler.last_step(), "config", "scheduler"} followed by extra's members (an object;
// the keys step/config/scheduler are reserved).
json::Value training_meta(const models::GPT& model, const optim::LRScheduler& scheduler,
                          const json::Value& extra);

// Writes the whole layout and commits the checkpoint (single writer); returns the directory.
// The step recorded is scheduler.last_step() (the optimizer steps taken). Files added to the
// writer before the call (a tokenizer, ...) are part of the checkpoint.
std::string save_training_state(CheckpointWriter& writer, const models::GPT& model,
                                const optim::Optimizer& optimizer,
                                const optim::LRScheduler& scheduler,
                                const json::Value& extra = json::Object{});

struct TrainingState {
  int64_t step = 0;  // meta.json "step"
  json::Value meta;  // the whole meta.json: "data", "rng", "train", "scheduler", ...
};

// Restores a run: checks that the checkpoint's config equals model.config() (a td::Error
// "checkpoint DIR was saved from a different model (checkpoint vs this model): n_layer: 4 vs 6"
// otherwise), then copies every parameter bitwise (shapes and dtypes must match exactly, no
// missing or extra names), loads the optimizer state by name (Note [Optimizer state by name];
// the optimizer must have the same name and group structure) and sets the scheduler to the saved
// last_step (its own LRScheduleConfig is kept, so a run may be extended). Each file's CRC is
// verified before it is read; nothing is modified when a check fails before the copy.
// Generator states ("rng") and the data position ("data") are the caller's to restore.
TrainingState load_training_state(const CheckpointReader& reader, models::GPT& model,
                                  optim::Optimizer& optimizer, optim::LRScheduler& scheduler);

// Only the parameters (for evaluation or generation): the config check and bitwise copy above.
void load_model_state(const CheckpointReader& reader, models::GPT& model);

}  // namespace td::checkpoint
