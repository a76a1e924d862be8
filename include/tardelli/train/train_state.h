#pragma once
// Checkpoints of the C++ training loop: python/tardelli/train/state.py's save and load, in its
// format (format 2, docs/checkpoints.md), so tardelli-train and python -m tardelli.train resume
// each other's checkpoints.
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
// Note [One checkpoint format for both loops]: every file is what state.py writes for the same
// state, byte for byte: the same pieces (Note [Layout-free checkpoints] in state.py: each rank
// saves boxes of the global tensors it holds, one replica saving each box) in the same order in
// the index files, the same JSON text (rng files as Python's json.dumps writes them, meta.json
// through the same CheckpointWriter), the same directory protocol (Note [Sharded saving] in
// checkpoint.h). tests/python/test_train_cpp.py compares a C++ and a Python save of one run file
// by file and resumes each in the other loop. Loading is state.py's load: the boxes this rank's
// layout needs, from whatever layout saved them; the dropout streams only at the same layout.
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

// meta.json's "parallel": the layout of `s` (state.py's _layout).
json::Value layout_json(const TrainState& s);

// Writes root/step_XXXXXXXX atomically and points root/latest at it; returns its path
// (root/step_XXXXXXXX). Collective over the world (every rank writes its pieces; rank 0
// commits). `step`: optimizer steps done; `consumed_samples`: the data position.
std::string save_state(const TrainState& s, const std::string& root, int64_t step,
                       int64_t consumed_samples,
                       const std::optional<NonfiniteCounters>& nonfinite = std::nullopt);

// Note [Async save] (python/tardelli/train/state.py's AsyncSaver): save() snapshots this rank's
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
// scaler's state when both have one. ConfigError (state.py's texts) for a checkpoint of another
// model (naming every differing field), other data settings (kResumeKeys) or one that cannot be
// read ("--resume: PATH: ..."). Collective: every rank fails alike when any rank's read fails.
LoadedState load_state(const TrainState& s, const std::string& path);

// The checkpoint --resume reads under `root` (checkpoint::find_latest); ConfigError
// "--resume: no complete checkpoint under ROOT (...)" (python's text) when there is none.
std::string resume_path(const std::string& root);

}  // namespace td::train
