#pragma once
// td::distributed::DistributedOptimizer: ZeRO-1 AdamW over a DistributedDataParallel in
// reduce_scatter mode (Megatron-core's DistributedOptimizer, in our own code).
//
// Each rank owns a contiguous 1/dp shard of every gradient bucket: elements
// [rank*S, (rank+1)*S) of a bucket of padded size dp*S. After ddp.finish_grad_sync() that shard
// holds the averaged gradient. For the shard only, the rank keeps fp32 master weights (its slice
// of the fp32 parameters themselves; a separate copy under offload or for other dtypes) and
// AdamW's exp_avg and exp_avg_sq: optimizer memory per rank is ~1/dp of the total
// (optimizer_state_bytes()).
//
// A shard may straddle parameters of different groups (weight decay on matrices, none on biases),
// so it is split into per-parameter pieces, and step() runs the fused td::adamw_step over the
// pieces of each group with that group's hyperparameters. The updated masters are then
// all-gathered bucket by bucket (two gathers in flight at a time, Note [Parameter all-gather])
// and copied into the parameter tensors, so every rank ends the step with identical parameters.
//
// Every DDP parameter must belong to exactly one group. The step count is one per optimizer (every
// parameter has a gradient, a view of its bucket, on every step: it is never None).
//
// Note [ZeRO-1 state names]: named_state() returns this rank's shard under keys
//   "<param>.master[a:b]", "<param>.exp_avg[a:b]", "<param>.exp_avg_sq[a:b]"
// where [a, b) is the element range of the flattened parameter held by this rank, plus "step"
// (an int64 one-element tensor). The tensors are shared with the optimizer (like state_dict());
// load_named_state() copies values in and requires exactly the same keys and sizes (the same
// dp size and bucket layout). A sharded checkpoint saves each rank's map.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tardelli/distributed/data_parallel.h"
#include "tardelli/optim/adamw.h"

namespace td::distributed {

// What else the sharded optimizer does besides ZeRO-1 (both compose with ZeRO-2 gradients,
// which it reads through ddp.shard_grad()).
struct ShardedOptimizerOptions {
  // Note [Optimizer offload]: the fp32 master weights, both moments and a gradient copy of this
  // rank's shard live in host memory (kCPU; page-locked when the parameters are on a GPU,
  // host_state_pinned()); step() copies the shard's gradient to the host, runs the fused CPU
  // td::adamw_step there and copies the updated masters back to the device shard it gathers
  // from. Device memory then holds no optimizer state at all.
  bool offload = false;
  // ZeRO-3: per DDP bucket, this rank's parameter shard ([shard_numel] on the parameters'
  // device, owned by FullyShardedDataParallel). step() updates them (they are the masters
  // unless offloaded: Note [Masters are the parameters]) and does not all-gather: the parameters
  // are gathered when next used.
  std::vector<Tensor> param_shards = {};
  // ZeRO-3: called after every write of the masters into param_shards (step(),
  // write_masters_to_param_shards(), load_state_dict()), so parameters gathered from the old
  // values are dropped (FullyShardedDataParallel::optimizer_options sets it).
  std::function<void()> param_shards_written = {};
};

class DistributedOptimizer {
 public:
  // One contiguous piece of this rank's shard: elements [start, start + numel) of the flattened
  // parameter ddp.params()[param], at `bucket_offset` in its bucket.
  struct Piece {
    size_t param = 0;
    size_t group = 0;
    size_t bucket = 0;
    int64_t start = 0;
    int64_t numel = 0;
    int64_t bucket_offset = 0;
    Tensor master, exp_avg, exp_avg_sq;  // fp32 [numel] (host memory under offload)
    Tensor grad;                         // fp32 [numel], a view of ddp.shard_grad(bucket)
    Tensor host_grad;                    // offload: the gradient's host copy [numel]
  };

  // `groups` hold DDP parameters with optional lr / weight_decay and AdamW option keys "beta1",
  // "beta2", "eps" (as optim::AdamW); unset values come from `defaults`. The DDP must use
  // reduce_scatter=true and outlive the optimizer.
  DistributedOptimizer(DistributedDataParallel& ddp, std::vector<optim::ParamGroup> groups,
                       const optim::AdamWOptions& defaults = {},
                       ShardedOptimizerOptions options = {});

  // One AdamW update of this rank's shard, then the all-gather of the parameters. Requires
  // ddp.finish_grad_sync() since the last backward (td::Error otherwise).
  void step();
  // ddp.zero_grad(): zeros the gradient buckets in place (gradients are never set to None).
  void zero_grad();

  // torch.nn.utils.clip_grad_norm_ (norm 2) on the full averaged gradient: the sum of squares of
  // the shard pieces (double, fixed order) is exchanged over the dp group and summed in rank
  // order, so every rank gets the same norm; when max_norm / (norm + 1e-6) < 1 the shard's
  // gradients are scaled by it. Returns the norm before clipping (non-finite: no clipping).
  double clip_grad_norm(double max_norm);
  double grad_norm();  // the same norm, no clipping
  // Multiplies this rank's shard of the averaged gradient by `factor` in place (fp16 loss
  // scaling: unscaling and clipping in one pass, optim::unscale_clip_factor).
  void scale_grads(double factor);

  // Note [Model-parallel grad norm] (Megatron's param_is_not_tensor_parallel_duplicate): under
  // tensor parallelism each tp rank's optimizer sees its own shards, so the norm of the full
  // model's gradient is the sum over the tp group of each rank's squares, where a parameter
  // split over tp counts on every tp rank and a replicated one (identical on all) only on tp
  // rank 0. counted[i] says whether ddp.params()[i] counts on this rank; the per-rank sums are
  // then summed over `model_parallel` too. td::Error when counted has the wrong length.
  void set_model_parallel(CommPtr model_parallel, std::vector<bool> counted);

  void set_lr(double lr);
  std::vector<optim::ParamGroup>& param_groups() { return groups_; }
  const std::vector<optim::ParamGroup>& param_groups() const { return groups_; }

  // Bytes of this rank's master weights and both moments (wherever they live); masters that
  // are the parameters themselves (masters_are_params) are not counted: 8 bytes per shard
  // element then, 12 otherwise.
  int64_t optimizer_state_bytes() const;
  // Without offload and with fp32 parameters, each master is the parameter's own slice (the
  // parameter shard under ZeRO-3), updated in place (Note [Masters are the parameters]).
  bool masters_are_params() const;
  // Of those (plus the offload gradient copy), the bytes held in host memory under offload.
  int64_t host_state_bytes() const;
  bool offloaded() const { return options_.offload; }
  // Offload of a GPU run: the host state is page-locked (allocate_pinned_host).
  bool host_state_pinned() const { return pinned_; }
  int64_t step_count() const { return step_; }
  const std::vector<Piece>& pieces() const { return pieces_; }

  // Note [ZeRO-1 state names].
  std::map<std::string, Tensor> named_state() const;
  void load_named_state(const std::map<std::string, Tensor>& state);
  // Re-copies the masters from the parameters (after parameters were loaded from elsewhere);
  // ZeRO-3: from the parameter shards.
  void sync_master_from_params();
  // ZeRO-3: writes the masters into the parameter shards (after load_named_state).
  void write_masters_to_param_shards();

 private:
  double local_sum_of_squares() const;
  // Each piece's master into its place in shard_in_ (the shard the parameters are gathered from).
  void copy_masters_to_shards();

  DistributedDataParallel& ddp_;
  ShardedOptimizerOptions options_;
  std::vector<optim::ParamGroup> groups_;
  std::vector<Piece> pieces_;
  std::vector<Tensor> shard_in_;  // per bucket: this rank's updated shard (ZeRO-3: the params')
  bool alias_ = false;            // Note [Masters are the parameters]
  bool pinned_ = false;           // host state in page-locked memory
  int64_t step_ = 0;
  CommPtr model_parallel_;
  std::vector<bool> counted_;  // per DDP parameter (empty: all count)
};

}  // namespace td::distributed
