#pragma once
// The pipeline-parallel runtime: cuts the GPT into stages (stage_layout, build_pipeline_stages)
// and executes this rank's action list of any schedule of pipeline_schedule.h over its model
// chunks (PipelineRuntime). The schedules are data; this is the one place that runs them.
//
//   auto chunks = td::parallel::build_pipeline_stages(config, grid.coords().pp, pp, vpp);
//   for (auto& c : chunks) td::parallel::parallelize(*c, grid, {.sequence_parallel = true});
//   td::parallel::PipelineRuntime pipe(chunks, grid, ScheduleKind::OneFOneB, m, 2, 256);
//   double loss = pipe.step(batches);   // m micro-batches forward + backward; grads in .grad()
//
// Note [Pipeline runtime]:
// - Virtual stage s (of pp * vpp) holds layers layout[s] and lives on pp rank s % pp as that
//   rank's chunk s / pp (Megatron's interleaved placement, Note [Virtual stages]). Stage 0
//   embeds, the last stage runs ln_f, the head and the loss.
// - Point to point: a forward sends the stage's output to the rank of stage s+1, a backward
//   sends the input gradient to the rank of stage s-1; sends are asynchronous, a receive blocks
//   until its data is there. A sent tensor is freed as soon as its send has completed, a sent
//   output's data even before its backward (Note [Sent tensors] in the .cpp). Shapes and
//   dtypes are known from the config ([micro_batch, seq_len (/tp under sequence parallelism),
//   d_model] in the compute dtype), so no shape is exchanged. Every message's tag names (direction,
//   micro-batch, virtual stage), so the order in which messages arrive never matters. The
//   schedule generator guarantees, and validate() checks, that no rank waits in a cycle.
// - The loss of each micro-batch is scaled by 1/m in backward, so gradients are those of the
//   mean over the step's micro-batches (the same as one rank with the whole global batch).
// - zb: backward is split: BackwardInput runs autograd::backward_input (the input gradient
//   only; every linear layer's weight-gradient GEMM is deferred) and BackwardWeight runs the
//   deferred GEMMs (autograd/weight_grad_store.h).
// - gpt2's tied embedding: with pp > 1 the last stage holds its own copy of wte.weight (the
//   same initial values, Note [Stage parameters] in models/gpt.h); after the step their
//   gradients are summed over the first and last stage (the embedding group), so both copies
//   take identical optimizer steps.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "tardelli/core/tensor.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/data_parallel.h"
#include "tardelli/distributed/process_grid.h"
#include "tardelli/models/gpt.h"
#include "tardelli/parallel/pipeline_schedule.h"

namespace td::parallel {

// Layers per virtual stage: pp * vpp counts. Even by default (td::Error unless n_layer is
// divisible by pp * vpp, suggesting an explicit layout); `layout`, when not empty, must be pp *
// vpp positive counts summing to n_layer (else td::Error naming them). td::Error for pp < 1 or
// vpp < 1.
std::vector<int64_t> stage_layout(int64_t n_layer, int pp, int vpp = 1,
                                  const std::vector<int64_t>& layout = {});

// This pp rank's model chunks: chunk c is virtual stage s = c * pp + pp_rank, a
// GPT(config, GPTStage{first layer of s, layers of s, pre = s == 0, post = s == last}) (layers
// from stage_layout). Every parameter holds the value the whole model would (Note [Stage
// parameters]). td::Error for a pp_rank outside [0, pp) and the stage_layout errors.
std::vector<std::shared_ptr<models::GPT>> build_pipeline_stages(
    const models::GPTConfig& config, int pp_rank, int pp, int vpp = 1,
    const std::vector<int64_t>& layout = {});

// One micro-batch: token ids [B, T] and targets [B, T]. Only the first stage reads `input` and
// only the last stage reads `target`; a rank may leave the other undefined.
struct MicroBatch {
  Tensor input;
  Tensor target;
};

// The last step on this rank: wall-clock seconds of the whole step (its sends, the tied
// embedding sum included), of its compute actions, and 1 - busy / step.
struct PipelineStepStats {
  double step_s = 0;
  double busy_s = 0;
  double bubble_fraction = 0;
};

class PipelineRuntime {
 public:
  // chunks: this rank's chunks in chunk order (build_pipeline_stages; already laid out over
  // tp/cp by parallelize if needed, on their device). grid: the runtime communicates over
  // grid.pp(); for gpt2 with pp > 1 it builds the embedding group by splitting grid.world()
  // (collective over the world: every rank constructs its runtime together). td::Error (before
  // any communication) when chunks is empty, when a non-interleaved schedule gets more than one
  // chunk, and for the make_schedule errors.
  PipelineRuntime(std::vector<std::shared_ptr<models::GPT>> chunks,
                  const distributed::ProcessGrid& grid, ScheduleKind kind, int microbatches,
                  int64_t micro_batch_size, int64_t seq_len);
  PipelineRuntime(const PipelineRuntime&) = delete;
  PipelineRuntime& operator=(const PipelineRuntime&) = delete;

  // Forward and backward of the step's m micro-batches (td::Error unless batches.size() == m).
  // Gradients accumulate into the chunks' parameters' .grad(): those of the mean loss times
  // loss_scale (fp16 loss scaling). Returns the mean unscaled loss over the micro-batches, the
  // same value on every pp rank (Note [Pipeline loss] in the .cpp says how it is rounded).
  double step(const std::vector<MicroBatch>& batches, double loss_scale = 1.0);
  // The mean loss of `batches` (any number of micro-batches) without autograd: each
  // micro-batch goes through the virtual stages in order (evaluation). Same value on every pp
  // rank.
  double forward_only(const std::vector<MicroBatch>& batches);

  // Whether step() sums the tied wte.weight gradient over the embedding group (default true).
  // Off under ZeRO-2/3, where the full gradients are gone after each micro-batch: the caller
  // sums the shards with sync_tied_embedding_shard instead.
  void set_sync_tied_grads(bool on) { sync_tied_grads_ = on; }
  bool sync_tied_grads() const { return sync_tied_grads_; }
  // ZeRO-2/3, after ddp.finish_grad_sync(): sums the tied wte.weight gradient shard over the
  // embedding group. wte.weight is a bucket of its own on both end stages (DDPOptions::
  // own_bucket, or its own ZeRO-3 unit), so both stages' shards cover the same elements. A
  // no-op without an embedding group; td::Error when no bucket holds wte.weight alone.
  void sync_tied_embedding_shard(distributed::DistributedDataParallel& ddp);

  // The last step's actions on this rank, in execution order, with wall-clock seconds
  // (system_clock since the epoch: comparable across the ranks of one machine). Compute only:
  // an action's clock starts after its receive.
  const std::vector<TimedAction>& timeline() const { return timeline_; }
  const PipelineStepStats& last_stats() const { return last_stats_; }
  // Every pp rank's timeline of the last step, indexed by pp rank, on every rank (collective
  // over the pp group).
  std::vector<std::vector<TimedAction>> gather_timelines();

  int pp() const { return pp_; }
  int rank() const { return rank_; }
  int vpp() const { return vpp_; }
  int microbatches() const { return m_; }
  ScheduleKind kind() const { return kind_; }
  const PipelineSchedule& schedule() const { return schedule_; }
  const std::vector<std::shared_ptr<models::GPT>>& chunks() const { return chunks_; }
  const distributed::CommPtr& pp_group() const { return pp_group_; }
  // gpt2 with pp > 1, on the first and last pp rank: the group summing the tied embedding's
  // gradient; null otherwise.
  const distributed::CommPtr& embedding_group() const { return embedding_group_; }
  // What a stage receives: shape, dtype and device of the activations and their gradients.
  const Shape& activation_shape() const { return act_shape_; }
  DType activation_dtype() const { return act_dtype_; }
  Device activation_device() const { return act_device_; }

 private:
  Tensor recv(int direction, int mb, int stage, int src);
  // Sends t asynchronously; `key` (micro-batch, chunk) marks a forward's output (else {-1, -1}).
  void send(const Tensor& t, int direction, int mb, int stage, int dst,
            std::pair<int, int> key = {-1, -1});
  // Drops the sends that have completed (rethrowing a failed one's error); returns the keys of
  // the forward outputs among them.
  std::vector<std::pair<int, int>> reap_sends();
  // Waits for every send not yet reaped (each with the communicator's timeout).
  void wait_sends();
  void sync_tied_embedding();
  double mean_over_pp(const std::vector<double>& losses);
  int holder(int stage) const { return rank_of_stage(stage, pp_); }
  bool is_last(int stage) const { return stage == stages_ - 1; }

  std::vector<std::shared_ptr<models::GPT>> chunks_;
  distributed::CommPtr pp_group_;
  distributed::CommPtr embedding_group_;
  int pp_ = 1, rank_ = 0, vpp_ = 1, stages_ = 1, m_ = 1;
  ScheduleKind kind_;
  PipelineSchedule schedule_;
  Shape act_shape_;
  DType act_dtype_ = DType::Float32;
  Device act_device_ = kCPU;
  bool sync_tied_grads_ = true;
  std::vector<TimedAction> timeline_;
  PipelineStepStats last_stats_;
  // This step's asynchronous sends not yet reaped, with the tensors they read.
  struct PendingSend {
    Tensor buffer;
    distributed::WorkPtr work;
    std::pair<int, int> key;  // a forward output's (micro-batch, chunk), else {-1, -1}
  };
  std::vector<PendingSend> pending_;
};

}  // namespace td::parallel
