#pragma once
// The parallelize step: lays a GPT written without parallelism out over a process grid
// (torchtitan's parallelize(), Megatron-LM's tensor/sequence parallel GPT). It applies tensor
// and sequence parallelism over grid.tp() and context parallelism over grid.cp(). Pipeline
// stages are not made here: with pp > 1 this rank's chunks come from build_pipeline_stages
// (parallel/pipeline_runtime.h) and parallelize() lays out each chunk like a whole model; so it
// refuses a whole model on a grid with pp > 1. Data parallelism wraps the result afterwards
// (DistributedDataParallel over grid.dp()).
//
//   auto model = std::make_shared<td::models::GPT>(config);     // full weights from the seed
//   td::parallel::parallelize(*model, grid, {.sequence_parallel = true});
//   // model->parameters() are now this rank's shards; forward/backward run the collectives.
//
// Every rank of the tp group must build the same config (same seed): each initializes the full
// model and keeps its slice (Note [Layout-independent init] in tensor_parallel.h), so a run at
// tp=4 starts from exactly the slices of the tp=1 model.
#include <cstdint>
#include <memory>

#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/process_grid.h"
#include "tardelli/models/gpt.h"
#include "tardelli/parallel/context_parallel.h"
#include "tardelli/parallel/rng_tracker.h"

namespace td::parallel {

struct ParallelOptions {
  bool sequence_parallel = false;
  // Megatron's --make-vocab-size-divisible-by: the vocabulary is padded to a multiple of this
  // times tp (padded rows are zero and never change the loss).
  int64_t make_vocab_size_divisible_by = 128;
  // How attention crosses the cp group when cp > 1 (context_parallel.h).
  CPComm cp_comm = CPComm::Ring;
};

// The tensor-parallel implementation of the GPT's layout hooks (Note [GPT tensor-parallel
// layout] in models/gpt_parallelism.h), built from the functions of tensor_parallel.h and
// vocab_parallel.h on activations [B, T, d] (sequence parallelism splits dim 1).
class GPTTensorParallel : public models::GPTParallelism {
 public:
  // seed: the model's seed; the split-activation dropout stream is Megatron's model-parallel
  // stream seed + 2718 + tp_rank (RngTracker::model_parallel).
  GPTTensorParallel(distributed::CommPtr tp, const ParallelOptions& options, uint64_t seed);

  int tp_size() const override { return tp_->size(); }
  int tp_rank() const override { return tp_->rank(); }
  bool sequence_parallel() const override { return options_.sequence_parallel; }
  int64_t padded_vocab(int64_t vocab_size) const override;

  Tensor column_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                       const models::LinearFn& gemm) override;
  Tensor row_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                    std::optional<MlpActivation> act, const models::LinearFn& gemm) override;
  double tp_max(double v) override;
  Tensor embedding(const Tensor& ids, const Tensor& w, bool sp) override;
  Tensor replicated(const Tensor& p) override;
  Tensor loss(const Tensor& h, const Tensor& w, const Tensor& targets, int64_t vocab_size,
              int64_t ignore_index, bool sp) override;
  Tensor logits(const Tensor& h, const Tensor& w, int64_t vocab_size, bool sp) override;
  Generator& split_generator() override { return rng_.get(kModelParallelRng); }

  const distributed::CommPtr& group() const { return tp_; }
  RngTracker& rng() { return rng_; }

 private:
  distributed::CommPtr tp_;
  ParallelOptions options_;
  RngTracker rng_;
};

// The context-parallel layout (Note [Zigzag layout] in context_parallel.h), around an optional
// tensor-parallel one (null: tp = 1, the plain one-device ops). The model's tokens are this
// rank's zigzag part of each sequence; attention runs context_parallel_attention over `cp`, the
// position tables are read at the zigzag positions and the loss is the cp group's mean (Note
// [Context-parallel loss]). Parameters are replicated over cp: their gradients must be reduced
// over the dp x cp group (the trainer's DDP does).
class GPTContextParallel : public models::GPTParallelism {
 public:
  GPTContextParallel(std::shared_ptr<GPTTensorParallel> tp, distributed::CommPtr cp, CPComm comm,
                     uint64_t seed);

  int tp_size() const override { return tp_ ? tp_->tp_size() : 1; }
  int tp_rank() const override { return tp_ ? tp_->tp_rank() : 0; }
  bool sequence_parallel() const override { return tp_ && tp_->sequence_parallel(); }
  int64_t padded_vocab(int64_t vocab_size) const override;

  Tensor column_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                       const models::LinearFn& gemm) override;
  Tensor row_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                    std::optional<MlpActivation> act, const models::LinearFn& gemm) override;
  double tp_max(double v) override;
  Tensor embedding(const Tensor& ids, const Tensor& w, bool sp) override;
  Tensor replicated(const Tensor& p) override;
  Tensor loss(const Tensor& h, const Tensor& w, const Tensor& targets, int64_t vocab_size,
              int64_t ignore_index, bool sp) override;
  // This rank's tokens' logits (not gathered over cp).
  Tensor logits(const Tensor& h, const Tensor& w, int64_t vocab_size, bool sp) override;
  Generator& split_generator() override { return tp_ ? tp_->split_generator() : gen_; }

  int cp_size() const override { return cp_->size(); }
  int cp_rank() const override { return cp_->rank(); }
  double cp_max(double v) override;
  std::vector<int64_t> positions(int64_t local_T) const override;
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) override;

  const distributed::CommPtr& group() const { return cp_; }
  CPComm comm() const { return comm_; }

 private:
  std::shared_ptr<GPTTensorParallel> tp_;
  distributed::CommPtr cp_;
  CPComm comm_;
  Generator gen_;
};

// Installs tensor (and, with options.sequence_parallel, sequence) parallelism over `tp` on a
// freshly built model. tp of size 1 installs nothing (the model stays the one-device model).
// td::Error when the model does not divide (GPT::set_parallelism) or sequence parallelism is
// asked for without tp.
void apply_tensor_parallel(models::GPT& model, const distributed::CommPtr& tp,
                           const ParallelOptions& options);

// Installs tensor (+ sequence) parallelism over `tp` and context parallelism over `cp` (either
// group may have size 1) on a freshly built model. td::Error when the model does not divide,
// or (a2a) its heads or kv heads per tp rank are not divisible by cp.
void apply_parallelism(models::GPT& model, const distributed::CommPtr& tp,
                       const distributed::CommPtr& cp, const ParallelOptions& options);

// Applies every model-parallel layout the grid asks for to one model or pipeline chunk: tensor
// parallelism over grid.tp(), context parallelism over grid.cp(). td::Error naming the degree
// when the grid has pp > 1 and `model` is the whole GPT (build this rank's chunks with
// build_pipeline_stages and parallelize each; the pipeline itself is PipelineRuntime).
void parallelize(models::GPT& model, const distributed::ProcessGrid& grid,
                 const ParallelOptions& options);

}  // namespace td::parallel
