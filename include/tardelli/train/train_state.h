#pragma once
// Checkpoints of the training loop (format 2, docs/checkpoints.md): what python -m
// tardelli.train and tardelli-train save and resume.
//
//   SAVE/latest                       the newest complete step directory
//   SAVE/step_00000500/meta.json      step, state_format 2, config, scheduler, data, rng,
//                                     optimizer, parallel (the saving layout), train (the flags),
//                                     loss_scaler (fp16), nonfinite (--on-nonfinite skip)
//   SAVE/step_00000500/shards.rankNNNNN.{safetensors,index.json}   rank NNNNN's pieces
//   SAVE/step_00000500/rng.rankNNNNN.json                          its dropout streams and
//                                     block linears' FP8 scalings and precision-policy state
//   SAVE/step_00000500/compression.rankNNNNN.safetensors           its compressors' error
//                                     feedback (--grad-compression), "<i>/<name>"
//   SAVE/step_00000500/vocab.json, merges.txt                      the tokenizer, if any
//
// Note [Layout-free checkpoints]: a rank saves what it holds as boxes of the global tensors
// (checkpoint/sharded_state.h): a tensor-parallel shard is one box per ShardSpec segment, an
// expert-parallel slice a box of dim 0, a ZeRO shard (a flat range of the rank's local tensor)
// a few boxes per parameter; replicas (dp, cp, tp-replicated tensors, gpt2's pipeline copy of
// the tied table) are saved by one rank only. Parameters and buffers go by their GPT names, the
// AdamW moments as "<param>.exp_avg" and "<param>.exp_avg_sq"; the masters are the fp32
// parameters, so only the moments are saved besides them. Loading computes the boxes this run's
// layout needs and reads them from whatever pieces cover them, so --resume works at any tp, pp,
// vpp, dp, cp, ep and ZeRO stage, with the same data position. Only the dropout streams and
// the compressors' error feedback are per layout: at the same layout every rank gets its own
// back (bitwise resume); at another, every chunk takes rank 0's stream (losses then match only
// without dropout) and the error feedback starts at zero. The block linears' FP8 scalings and
// precision-policy state are the same on every rank holding a layer, so they are found by name
// at any layout. A whole-tensor checkpoint (model.safetensors + optimizer.safetensors:
// examples/train_gpt.cpp's) loads the same way.
//
// The files were first written by the Python trainer (format 2 dates from it); the C++ loop
// writes them byte for byte as it did, so checkpoints of older runs resume unchanged.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tardelli/core/json.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/distributed_optimizer.h"
#include "tardelli/distributed/fully_sharded.h"
#include "tardelli/distributed/grad_compression.h"
#include "tardelli/distributed/process_grid.h"
#include "tardelli/models/gpt.h"
#include "tardelli/optim/adamw.h"
#include "tardelli/optim/loss_scaler.h"
#include "tardelli/train/train_config.h"
#include "tardelli/train/train_precision.h"

namespace td::train {

inline constexpr int64_t kStateFormat = 2;  // meta.json "state_format"

// The --on-nonfinite skip counters a checkpoint keeps (meta.json "nonfinite").
struct NonfiniteCounters {
  int64_t skips = 0;        // steps skipped in the whole run
  int64_t consecutive = 0;  // in a row, up to the checkpoint's step
};

// What a checkpoint holds of a run: views of a Trainer's parts (Trainer::state_view()), valid
// while the trainer lives.
struct TrainState {
  const TrainConfig* cfg = nullptr;
  models::GPTConfig model_config;                    // the run's (meta.json "config")
  std::vector<std::shared_ptr<models::GPT>> chunks;  // this rank's model chunks
  distributed::CommPtr world;                        // null: one plain process
  const distributed::ProcessGrid* grid = nullptr;    // null: one plain process
  optim::AdamW* adamw = nullptr;                     // one of adamw / zero is set
  distributed::DistributedOptimizer* zero = nullptr;
  // Expert parallelism under ZeRO: the experts' sharded optimizer (its state saved after the
  // dense one's, as python's ExpertDistributedOptimizer.state_dict orders it).
  distributed::DistributedOptimizer* expert_zero = nullptr;
  // ZeRO-3: the parameters live in its shards (gathered to save, scattered when loading).
  distributed::FullyShardedDataParallel* fsdp = nullptr;
  // --grad-compression: each DDP's compressor, whose error feedback is per-rank state
  // (compression.rankNNNNN.safetensors, restored at the same layout only).
  std::vector<std::shared_ptr<distributed::GradCompressor>> compressors;
  optim::DynamicLossScaler* scaler = nullptr;  // fp16
  BlockPrecision* precision = nullptr;         // the block linears' state (null: names only)
  std::string tokenizer_dir;                   // copied into the checkpoint when not empty
};

// meta.json's "parallel": the layout of `s` .
json::Value layout_json(const TrainState& s);

// Writes root/step_XXXXXXXX atomically and points root/latest at it; returns its path
// (root/step_XXXXXXXX). Collective over the world (every rank writes its pieces; rank 0
// commits). `step`: optimizer steps done; `consumed_samples`: the data position.
std::string save_state(const TrainState& s, const std::string& root, int64_t step,
                       int64_t consumed_samples,
                       const std::optional<NonfiniteCounters>& nonfinite = std::nullopt);

// Note [Async save]: save() snapshots this rank's
// pieces into host memory, opens the writers (a barrier) and returns; a thread writes the files.
// poll(), called by every rank at the same points while a save is pending, exchanges (done,
// failed) in one all-reduce; once every rank is done rank 0 commits (meta.json last, the
// rename, latest). At most one save is in flight. A crash while writing leaves only the .tmp
// directory: the previous checkpoint stays the latest. The destructor joins the writer (it does
// not commit). Test-only: TD_TEST_ASYNC_SAVE_DELAY=SECONDS delays the thread's writing.
class AsyncSaver {
 public:
  explicit AsyncSaver(distributed::CommPtr world);
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // As save_state (waits for and commits a pending save first); returns the path the
  // checkpoint will have.
  std::string save(const TrainState& s, const std::string& root, int64_t step,
                   int64_t consumed_samples,
                   const std::optional<NonfiniteCounters>& nonfinite = std::nullopt);
  // Commits the pending save once every rank has written its files (block: after this rank's
  // thread ends); returns the committed path, nullopt when none was committed. td::Error on
  // every rank when any rank's writing failed, naming the checkpoint. Collective while a save
  // is pending.
  std::optional<std::string> poll(bool block = false);
  std::optional<std::string> wait() { return poll(true); }
  bool pending() const { return job_ != nullptr; }

 private:
  struct Job;
  distributed::CommPtr world_;
  std::shared_ptr<Job> job_;
  std::thread thread_;
};

// What load_state restored besides the tensors.
struct LoadedState {
  std::string path;  // the step directory read
  int64_t step = 0;
  int64_t consumed_samples = 0;
  bool resharded = false;  // saved at another layout
  std::optional<optim::LossScalerState> loss_scaler;
  std::optional<NonfiniteCounters> nonfinite;
  // The run compresses gradients but the checkpoint has no error feedback for this rank (saved
  // at another layout): it starts at zero.
  bool error_feedback_reset = false;
};

// Restores parameters, optimizer moments and step, and (at the same layout) the dropout streams
// from the step directory `path` into freshly built objects, whatever layout saved it; the loss
// scaler's state when both have one. ConfigError for a checkpoint of another
// model (naming every differing field), other data settings (kResumeKeys) or one that cannot be
// read ("--resume: PATH: ..."). Collective: every rank fails alike when any rank's read fails.
LoadedState load_state(const TrainState& s, const std::string& path);

// The checkpoint --resume reads under `root` (checkpoint::find_latest); ConfigError
// "--resume: no complete checkpoint under ROOT (...)" (python's text) when there is none.
std::string resume_path(const std::string& root);

}  // namespace td::train
