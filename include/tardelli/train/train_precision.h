#pragma once
// The training loop's side of the block linears' precision (docs/fp8.md): FP8 scalings (--fp8)
// and the per-layer precision policy (--precision-policy adaptive, --precision-map), built from
// the configuration, agreed on once per step over the ranks holding the same layers (the
// tp x cp x dp group: Note [Amax reduction] in parallel/precision_sync.h), reported in the
// metrics rows and kept in each rank's rng file of a checkpoint (train_state.h).
//
// The metrics row's "precision" object counts the whole model's linears per precision
// ({"fp8": n, "bf16": n, "fp32": n}) and lists the step's decisions as "changes"
// (["h.1.mlp.c_fc:fp8->bf16", ...]); it is reported under the adaptive policy or a map, and
// every pipeline stage's linears count (a max over the pp group of per-layer codes).
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tardelli/core/json.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/models/gpt.h"
#include "tardelli/models/precision_policy.h"
#include "tardelli/train/train_config.h"

namespace td::train {

// Whether the block linears have any precision state to agree on across ranks (--fp8, the
// adaptive policy or a map).
bool precision_active(const TrainConfig& cfg);

class BlockPrecision {
 public:
  // Sets up every chunk's FP8 scalings and precisions from `cfg`. `group`: the ranks holding
  // the same layers (null: this rank alone); `pp_group`: to report every stage's linears (null
  // without pipelining). ConfigError for a bad --precision-map.
  BlockPrecision(const TrainConfig& cfg, std::vector<std::shared_ptr<models::GPT>> chunks,
                 distributed::CommPtr group, distributed::CommPtr pp_group);

  // Whether the metrics carry the "precision" object (adaptive policy or a map).
  bool report() const { return report_; }
  // The end of a training step (collective over the group, and over pp when reporting): amaxes
  // reduced and committed, the policy's decisions applied. Returns the row's "precision" object
  // (nullopt when there is nothing to report).
  std::optional<json::Value> step();
  // The summary's "precision" counts (of the codes reported last).
  json::Value summary_counts() const;
  // Whether every rank reports the same precisions for the whole model (collective over
  // `world`).
  bool replicated(const distributed::CommPtr& world) const;

  // What a checkpoint keeps of chunk `i`'s block linears: {"linears": names, "fp8": per linear
  // [[scale, [amax...]] x (input, weight, grad)], "precision": {"precisions", "stable"}} (the
  // last two only when present), in the order python's json.dumps writes them.
  json::Value chunk_state(size_t i) const;
  // Restores chunk `i` from saved chunk states (each one rank's chunk, any layout): each linear
  // takes the first saved entry of its name; nothing is restored unless every linear of the
  // chunk is found.
  void load_chunk_state(size_t i, const std::vector<const json::Value*>& saved);

 private:
  std::vector<std::shared_ptr<models::GPT>> chunks_;
  std::vector<std::shared_ptr<models::PrecisionPolicy>> policies_;  // per chunk (may be null)
  distributed::CommPtr group_, pp_group_;
  bool report_ = false;
  int64_t n_layer_ = 0;
  std::optional<std::vector<int64_t>> codes_;  // reported last (set at the first step)

  std::vector<int64_t> global_codes() const;
};

}  // namespace td::train
