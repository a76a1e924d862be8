#pragma once
// td::train::Trainer: the training loop of `tardelli-train` and of custom C++ trainers, usable
// whole (run()) or piece by piece (build, then train_step() / evaluate() in the caller's loop).
//
//   auto cfg = td::train::parse_config(args, world ? world->size() : 1);
//   td::train::Trainer trainer(cfg, world);          // layout, model, DDP/ZeRO, optimizer, data
//   while (trainer.step() < cfg.steps) {
//     td::train::StepRecord rec = trainer.train_step();
//     ...                                           // rec.loss, rec.grad_norm, rec.to_json()
//   }
//
// Note [C++ training loop]: the one training loop of the project. python -m tardelli.train is a
// thin front end over it (python/tardelli/train/trainer.py: argument parsing, --plan auto, the
// progress bar and plots), tardelli-train another (tools/tardelli_train.cpp), a custom C++
// trainer a third (examples/cpp/custom_trainer.cpp). One optimizer step: the learning rate of
// the step on every group; the micro-batches' forward and backward (through the pipeline
// runtime's schedule under pp, with the DDP reduction held until the step's last
// micro-batch); the reduction; the gradient norm over the whole model (ZeRO: the sharded
// optimizer's; tp/pp: parameters split over tp on every tp rank, replicated ones on tp rank 0,
// summed over tp-pp with sum_over_ranks; one process: torch's clip_grad_norm_ rule with an
// fp32 coefficient); fp16's dynamic loss scale (a step whose scaled norm is not finite is
// skipped: Note [fp16 loss scaling] in src/train/trainer.cpp); the optimizer step; the block
// linears' precision step; the metrics row (the loss is the mean over every rank in fp32).
// The arithmetic was first written in Python and ported operation for operation (Python's
// floats as doubles summed in the same order, src/train compiled without FMA contraction), so
// runs and checkpoints of older versions continue bitwise.
//
// --on-nonfinite skip agrees on a non-finite loss or gradient norm over every rank and skips the
// update (Note [Non-finite steps] in src/train/trainer.cpp); run() logs stragglers
// (stragglers() below). MoE: the step resets the statistics, applies the router-bias step after
// the update (loads summed over dp) and reports the cross-entropy as the loss with the moe_*
// metrics apart (Note [MoE metrics] in src/train/train_moe.cpp); expert parallelism reduces
// and updates the experts with their own DDP and optimizer (Note [Expert gradients] in
// python/tardelli/distributed/expert_parallel.py).
//
// Checkpoints (--save, --save-interval, --exit-interval, --resume, --async-save) are
// train_state.h's: a resume at the same layout is bitwise, at another one it goes through the
// layout-free pieces (Note [Layout-free checkpoints]). Under python -m tardelli.launch
// --max-restarts, run() writes the supervisor's heartbeats and restart events
// (train/supervision.h).
//
// FP8 and per-layer precision (--fp8, --precision-policy, --precision-map): the block linears'
// state is agreed on once per step after the update, over the ranks holding the same layers
// (train_precision.h), and reported in the row's "precision" object.
//
// --plan auto is resolved by the Python front end (the planner is Python) before the loop is
// built; the constructor refuses a configuration that still asks for it.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tardelli/core/json.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/data_parallel.h"
#include "tardelli/distributed/distributed_optimizer.h"
#include "tardelli/distributed/fully_sharded.h"
#include "tardelli/distributed/process_grid.h"
#include "tardelli/models/gpt.h"
#include "tardelli/optim/adamw.h"
#include "tardelli/optim/loss_scaler.h"
#include "tardelli/parallel/pipeline_runtime.h"
#include "tardelli/train/train_config.h"
#include "tardelli/train/train_data.h"
#include "tardelli/train/train_precision.h"
#include "tardelli/train/train_state.h"

namespace td::train {

// A mixture-of-experts step's statistics (Note [MoE metrics] in src/train/train_moe.cpp):
// unscaled aux and z losses (means over layers, forwards and ranks), the busiest
// expert's load over the mean (max over layers, and the mean over layers), token-slots dropped
// by the capacity (summed over layers and dp ranks).
struct MoEMetrics {
  double aux_loss = 0, z_loss = 0, max_load = 0, mean_load = 0;
  int64_t dropped_tokens = 0;
};

// One optimizer step's metrics: the row python -m tardelli.train writes to --metrics-file.
struct StepRecord {
  int64_t step = 0;      // steps done after this one (1-based)
  double loss = 0;       // mean training loss over the step's micro-batches and all ranks
  double lr = 0;         // the learning rate the step used
  double grad_norm = 0;  // the global gradient norm before clipping (unscaled under fp16)
  double tokens_per_s = 0;
  double time = 0;        // wall clock at the end of the step (seconds since the epoch)
  double mfu = 0;         // model FLOPs / step time / (GEMM peak x ranks)
  int64_t mem_bytes = 0;  // this rank's allocator peak in the step
  int64_t peak_mem_bytes_max_rank = 0;
  std::vector<double> rank_compute_s, rank_wait_s;  // per world rank (Note [Straggler report])
  std::optional<int64_t> dp_comm_bytes;             // bytes handed to the gradient reduction
  std::optional<int64_t> cross_node_bytes;          // --hierarchical-reduce: of those, across nodes
  std::optional<MoEMetrics> moe;                    // --num-experts: the moe_* keys
  std::optional<double> loss_scale;                 // fp16
  std::optional<json::Value> precision;             // adaptive policy or a map (train_precision.h)
  std::optional<bool> skipped;             // fp16 or --on-nonfinite skip: the update was skipped
  std::optional<int64_t> nonfinite_skips;  // --on-nonfinite skip: steps skipped so far
  std::optional<double> val_loss;          // on evaluation steps
  std::optional<double> save_blocked_s;    // steps that saved: seconds the save blocked
  double step_seconds = 0;  // the step's wall time (not in the row: tokens_per_s says it)
  // Not in the row either: --on-nonfinite skip skipped this step for a non-finite loss or
  // gradient norm (Note [Non-finite steps] in src/train/trainer.cpp).
  bool nonfinite = false;

  // The metrics row (its keys in a fixed order: docs/training.md).
  json::Value to_json() const;
};

// "step      5/100 | loss 4.1234 | lr 6.000e-04 | ..."
std::string format_log_line(const StepRecord& r, int64_t steps);

// The best GEMM rate of this library here for `dtype` on `device` (FLOP/s): MFU's denominator,
// measured once (n = 1024 on the CPU, 4096 on a GPU; the best of `reps`).
double gemm_peak_flops(DType dtype, Device device, int64_t n = 0, int reps = 5);

// The straggler report (Note [Straggler report] in src/train/trainer.cpp): each step
// every rank's time is split into compute and wait (seconds blocked in the job's
// communicators), gathered over the world into the metrics row; a rank whose compute exceeds
// --straggler-threshold x the median (and the median by kStragglerMinExcessS: on steps of
// milliseconds the ratio is scheduler noise) is logged, at most once per --log-interval steps.
inline constexpr double kStragglerMinExcessS = 0.01;
// (world rank, compute / median) of the stragglers among `compute` (seconds per world rank);
// none for one rank or threshold 0 (python's stragglers()).
std::vector<std::pair<int, double>> stragglers(const std::vector<double>& compute,
                                               double threshold);
// "train: straggler rank R: compute X s is Y x the median".
std::string straggler_line(int rank, double compute_s, double ratio);
// Testing aid: TD_TEST_SLOW_RANK="RANK:SECONDS" makes world rank RANK sleep SECONDS in every
// step's compute (a simulated straggler); 0 on the other ranks or unset; ConfigError when
// malformed.
double slow_rank_seconds(int rank);

// A run built only to hold a checkpoint (python -m tardelli.checkpoint convert: load at one
// layout, save at another): no data is read (the layout is built as for synthetic tokens of
// `vocab_size`), the configuration's data settings are kept for meta.json, and saves copy the
// tokenizer of `tokenizer_dir` (empty: none).
struct CheckpointOnly {
  int64_t vocab_size = 0;
  std::string tokenizer_dir;
};

class Trainer {
 public:
  // Builds the run: joins `world` (null: one process; a world of one is made only if needed),
  // lays out the ProcessGrid (tp fastest, then cp, dp, pp), the model chunks (Note [Parallelize
  // step]), the DDP/ZeRO reduction, the optimizer, the loss scaler and the data. Collective
  // over the world. td::Error naming the flag for what the C++ loop does not support yet.
  Trainer(TrainConfig cfg, distributed::CommPtr world = nullptr,
          std::optional<CheckpointOnly> checkpoint_only = std::nullopt);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  const TrainConfig& config() const { return cfg_; }
  const models::GPTConfig& model_config() const { return mcfg_; }
  // Null for one plain process.
  const distributed::CommPtr& world() const { return world_; }
  const distributed::ProcessGrid* grid() const { return grid_.get(); }
  int64_t dp_size() const { return dp_size_; }
  int64_t accumulation_steps() const { return accum_; }
  int64_t global_batch() const { return global_batch_; }
  // This rank's model chunks (one without pipelining).
  const std::vector<std::shared_ptr<models::GPT>>& chunks() const { return chunks_; }
  parallel::PipelineRuntime* pipeline() const { return pipe_.get(); }
  // The gradient reduction (ZeRO-3: the FSDP's; expert parallelism: the dense parameters');
  // null for one plain process.
  distributed::DistributedDataParallel* ddp() const { return ddp_; }
  // ZeRO-3's parameter sharding; null otherwise.
  distributed::FullyShardedDataParallel* fsdp() const { return fsdp_.get(); }
  // Expert parallelism: the experts' gradient reduction and (ZeRO) sharded optimizer; null
  // otherwise.
  distributed::DistributedDataParallel* expert_ddp() const { return expert_ddp_.get(); }
  distributed::DistributedOptimizer* expert_optimizer() const { return expert_opt_.get(); }
  // The sharded optimizer (ZeRO; the dense parameters' under expert parallelism) or the AdamW
  // (without ZeRO); the other is null.
  distributed::DistributedOptimizer* sharded_optimizer() const { return zero_opt_.get(); }
  optim::AdamW* adamw() const { return adamw_.get(); }
  // The --grad-compression compressors, one per DDP (their error feedback is per-rank state a
  // checkpoint keeps); empty without compression.
  const std::vector<std::shared_ptr<distributed::GradCompressor>>& compressors() const {
    return compressors_;
  }
  // The block linears' FP8 scalings and per-layer precision (train_precision.h).
  const BlockPrecision& precision() const { return *precision_; }
  // Parameters of the whole logical model (a pipeline counts every stage, gpt2's tied table
  // once); model FLOPs of one step.
  int64_t num_parameters() const { return n_params_; }
  double flops_per_step() const { return flops_per_step_; }
  double peak_flops() const { return peak_; }
  bool is_main() const { return world_ == nullptr || world_->rank() == 0; }

  // Optimizer steps done so far.
  int64_t step() const { return step_; }
  // --on-nonfinite skip: steps skipped for a non-finite loss or gradient norm, all and the
  // latest run of consecutive ones (a checkpoint keeps both; set them when resuming).
  int64_t nonfinite_skips() const { return skips_; }
  int64_t consecutive_skips() const { return consecutive_; }
  void set_nonfinite_skips(int64_t skips, int64_t consecutive) {
    skips_ = skips;
    consecutive_ = consecutive;
  }
  double lr_at(int64_t step) const;
  // One optimizer step (the next one) over accumulation_steps() micro-batches per rank;
  // evaluates when the step is an --eval-interval multiple or the last. td::Error for a
  // diverged (non-finite) loss or gradient norm, naming the step; under --on-nonfinite skip
  // such a step is skipped on every rank instead (rec.nonfinite; run() stops after
  // --max-skipped-steps consecutive ones).
  StepRecord train_step();
  // The mean validation loss over --eval-steps micro-batches, averaged over the ranks; nullopt
  // without a validation split or with --eval-steps 0.
  std::optional<double> evaluate();

  // The loop: steps until --steps (or --exit-interval), writing --metrics-file rows and the log
  // lines to `log` (rank 0) and the checkpoints of --save; returns the summary (the "train_end"
  // object).
  // `on_step` (optional) sees every step's record after its metrics row is written (a front
  // end's progress bar).
  json::Value run(const std::function<void(const std::string&)>& log,
                  const std::function<void(const StepRecord&)>& on_step = {});
  // Under pp: every pp rank's timeline of run()'s last step (gathered by run(); empty before).
  const std::vector<std::vector<parallel::TimedAction>>& last_timelines() const {
    return timelines_;
  }

  // Writes the checkpoint of the steps done so far: root/step_XXXXXXXX, then root/latest
  // (train_state.h); returns its path. Collective over the world.
  std::string save(const std::string& root);
  // Restores the checkpoint in step directory `path` (any layout: train_state.h's load_state)
  // and moves the data to its position; what --resume does in the constructor. Collective.
  const LoadedState& load_checkpoint(const std::string& path);
  // The checkpoint --resume (or load_checkpoint) restored (nullopt: a fresh run).
  const std::optional<LoadedState>& resumed() const { return resumed_; }
  // This run's parts that a checkpoint holds.
  TrainState state_view() const;

 private:
  TrainConfig cfg_;
  distributed::CommPtr world_;
  std::unique_ptr<distributed::ProcessGrid> grid_;
  int64_t dp_size_ = 1, accum_ = 1, global_batch_ = 0;
  models::GPTConfig mcfg_;
  std::unique_ptr<TrainData> data_;
  std::unique_ptr<BatchSource> loader_;
  std::vector<std::shared_ptr<models::GPT>> chunks_;
  std::unique_ptr<parallel::PipelineRuntime> pipe_;
  // Declared before the optimizers that use them (destroyed after).
  std::shared_ptr<distributed::FullyShardedDataParallel> fsdp_;      // ZeRO-3
  std::unique_ptr<distributed::DistributedDataParallel> ddp_owned_;  // without ZeRO-3
  distributed::DistributedDataParallel* ddp_ = nullptr;              // either one's DDP
  // Expert parallelism (Note [Expert gradients] in python/tardelli/distributed/
  // expert_parallel.py): ddp_ holds the dense parameters, expert_ddp_ the experts' (over edp,
  // 1 / ep), each with its own sharded optimizer under ZeRO.
  std::unique_ptr<distributed::DistributedDataParallel> expert_ddp_;
  distributed::CommPtr expert_group_;  // tp-ep-pp: the experts' part of the gradient norm
  std::unique_ptr<distributed::DistributedOptimizer> zero_opt_, expert_opt_;
  std::vector<std::shared_ptr<distributed::GradCompressor>> compressors_;  // one per DDP
  // The gradient reductions' communicators, and their cross-node groups (--hierarchical-reduce).
  std::vector<distributed::CommPtr> reduce_comms_, cross_comms_;
  std::unique_ptr<optim::AdamW> adamw_;
  std::unique_ptr<optim::DynamicLossScaler> scaler_;
  std::unique_ptr<BlockPrecision> precision_;
  distributed::CommPtr mp_group_;  // tp, or tp-pp with pipelining; null without model parallelism
  Device device_ = kCPU;
  int64_t n_params_ = 0;
  double flops_per_step_ = 0, peak_ = 0;
  int64_t step_ = 0;
  int64_t skips_ = 0, consecutive_ = 0;      // Note [Non-finite steps]
  std::set<int64_t> inject_grad_;            // --inject-nonfinite-grad steps
  std::set<int64_t> inject_loss_;            // --inject-nonfinite-loss steps of this rank
  double slow_s_ = 0;                        // TD_TEST_SLOW_RANK
  std::vector<distributed::CommPtr> comms_;  // every communicator of the job (each once)

  std::optional<LoadedState> resumed_;
  std::optional<int> attempt_;  // supervised restarts: this attempt (supervision.h)
  // Said before the layout line: a supervised first attempt with nothing to resume, or a resume
  // whose compressors' error feedback starts at zero.
  std::string fresh_start_note_;
  std::unique_ptr<AsyncSaver> saver_;  // --async-save, made at the first save
  std::optional<CheckpointOnly> checkpoint_only_;
  std::vector<std::vector<parallel::TimedAction>> timelines_;  // pp: run()'s last step

  // The DDP (or ZeRO-3's FSDP) and the optimizer over `named` (src/train/trainer_reduction.cpp).
  void build_reduction(const nn::NamedTensors& named, const std::vector<optim::ParamGroup>& groups,
                       const optim::AdamWOptions& defaults);
  // The group a gradient reduction over `axes` runs on: grid_->group(axes), two-level with
  // --hierarchical-reduce (a new communicator, collective over the group).
  distributed::CommPtr reduction_group(const std::string& axes) const;
  // A fresh --grad-compression compressor for one DDP (null for none).
  std::shared_ptr<distributed::GradCompressor> make_compressor();
  void add_reduce_comm(const distributed::CommPtr& g);
  // The DDPs of the step: ddp_ and, under expert parallelism, expert_ddp_ (none for one
  // process).
  std::vector<distributed::DistributedDataParallel*> ddp_parts() const;
  // Per parameter of `ddp`: whether it counts in the gradient norm on this rank.
  std::vector<bool> counted_in_norm(const distributed::DistributedDataParallel& ddp) const;
  // The data-parallel group (null for one plain process).
  distributed::CommPtr dp_group() const { return grid_ != nullptr ? grid_->dp() : nullptr; }
  double grad_norm_clipped(double max_norm);
  // Checkpoint hooks (src/train/trainer_checkpoint.cpp): --resume's load (returns the data
  // position to start from; 0 without --resume); the step's save when one is due, timed into
  // rec.save_blocked_s; the commit of a background save at the end of run().
  int64_t restore();
  void save_if_due(StepRecord& rec, bool exiting, bool give_up,
                   const std::function<void(const std::string&)>& say);
  // meta.json's "nonfinite" (--on-nonfinite skip only).
  std::optional<NonfiniteCounters> nonfinite_counters() const;
  void finish_saves(const std::function<void(const std::string&)>& say);
  std::string resumed_line() const;  // "train: resumed from PATH at step N (...)"
  std::vector<Tensor> parameters() const;
};

}  // namespace td::train
