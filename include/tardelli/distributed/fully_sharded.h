#pragma once
// td::distributed::FullyShardedDataParallel: ZeRO-3 (FSDP). Between uses every parameter is
// sharded over the data-parallel group: rank r keeps only elements [r*S, (r+1)*S) of each unit's
// flattened (padded) parameters, in fp32. The model calls materialize()/release() around each
// unit (models/param_units.h; the GPT's units are its blocks, embeddings and head), and this
// class all-gathers the unit's shards into one flat buffer, points the parameters' storage into
// it, and frees it again after the forward. Backward gathers each unit again before its
// gradients are computed, and the unit's gradients are reduce-scattered into fp32 shards as
// soon as they are complete (ZeRO-2 machinery: a DistributedDataParallel with shard_grads whose
// buckets are the units, in backward order). Pair it with DistributedOptimizer constructed with
// optimizer_options(): it updates the shards, gathers nothing, and tells this class to drop the
// units gathered from the old values (Note [Stale gathers]).
//
// Note [FSDP prefetch]: materialize(u) in forward waits for unit u's gather and starts unit
// u+1's (same chunk) asynchronously, so the next gather overlaps unit u's compute; in backward
// the boundary node of unit u starts unit u-1's. At most two units are gathered at once
// (the current and the prefetched one), plus, in backward, the unit whose gradients are still
// being accumulated. All ranks issue the same gathers in the same order (the model runs the
// same units in the same order on every rank).
//
// Mixed precision: the shards (and the optimizer's masters) are fp32; a bf16/fp16 model's blocks
// and head are gathered in the compute dtype (Note [Compute-dtype gathers]), the embedding
// tables in fp32 (the model reads them uncast).
//
// Memory per rank (fp32 parameters and gradients, N = parameters of this rank's model or tp
// shard, dp ranks): parameter shards 4N/dp (also the optimizer's masters) + gradient shards
// 4N/dp + AdamW moments 8N/dp (DistributedOptimizer) + the working set of one or two gathered
// units (4 bytes per element each, and their transient full gradients). docs/memory.md.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/data_parallel.h"
#include "tardelli/distributed/distributed_optimizer.h"
#include "tardelli/models/param_units.h"
#include "tardelli/nn/module.h"

namespace td::models {
class GPT;
}

namespace td::distributed {

struct FSDPOptions {
  bool prefetch = true;  // Note [FSDP prefetch]
  bool average = true;   // gradients averaged over dp (false: summed)
  // shard(): a bf16/f16 model's blocks and head gather in its compute dtype over the fp32
  // shards (Note [Compute-dtype gathers]); false: everything gathers fp32 and is cast.
  bool compute_dtype_gathers = true;
};

class FullyShardedDataParallel final : public models::ParamUnits {
 public:
  // `units`: the parameter groups in forward order (empty groups allowed); `chunk_of[u]` the
  // model chunk unit u belongs to (prefetch stays inside a chunk; empty: one chunk). Every
  // parameter must be an fp32 contiguous leaf owning its storage, listed once. The parameters'
  // storage is released here; their values live in the shards from now on.
  // `gather_dtypes[u]`: the dtype unit u is gathered in (empty: all fp32); a unit in another
  // dtype hands its parameters to the model through compute_param().
  FullyShardedDataParallel(std::vector<nn::NamedTensors> units, CommPtr dp,
                           std::vector<int64_t> chunk_of = {}, FSDPOptions options = {},
                           std::vector<DType> gather_dtypes = {});
  ~FullyShardedDataParallel() override;
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // Shards every chunk's parameters (GPT::param_units, chunk k's units after chunk k-1's) and
  // installs the result in each chunk (GPT::set_param_units).
  static std::shared_ptr<FullyShardedDataParallel> shard(
      const std::vector<std::shared_ptr<models::GPT>>& chunks, CommPtr dp,
      FSDPOptions options = {});

  void materialize(int64_t unit) override;
  Tensor release(const std::vector<int64_t>& units, const Tensor& y) override;
  std::optional<Tensor> compute_param(const Tensor& p, DType dtype) override;

  // The gradient reduction (ZeRO-2 over the units): zero_grad() / finish_grad_sync() as usual.
  DistributedDataParallel& ddp();
  // Per DDP bucket: this rank's parameter shard [shard_numel] fp32 (the values; the optimizer
  // writes its updates here).
  const std::vector<Tensor>& param_shards() const;
  // Options for the DistributedOptimizer that updates these shards: param_shards() and the
  // param_shards_written callback (shards_written()), plus `offload`.
  ShardedOptimizerOptions optimizer_options(bool offload = false);
  // The shards were written (optimizer step, a checkpoint load): every gathered unit is dropped
  // and gathered again from the new values when next used.
  void shards_written();

  // The full parameters, gathered (a collective over dp; every rank gets them): name -> tensor,
  // in the units' order. For checkpoints and tests.
  nn::NamedTensors full_parameters();
  // Sets the parameters from full values (only this rank's shard is kept). Names must match.
  void load_full_parameters(const std::map<std::string, Tensor>& full);

  // Instrumentation: bytes of gathered parameters held right now and at most since the last
  // reset, and the number of all-gathers issued.
  int64_t gathered_bytes() const;
  int64_t peak_gathered_bytes() const;
  void reset_peak_gathered_bytes();
  int64_t num_gathers() const;

  struct State;  // shared with autograd nodes and hooks (Note [DDP state and hooks])

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<DistributedDataParallel> ddp_;
};

}  // namespace td::distributed
