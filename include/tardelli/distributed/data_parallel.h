#pragma once
// td::distributed::DistributedDataParallel: data parallelism with bucketed gradient reduction that
// overlaps backward (Megatron-core's DistributedDataParallel, in our own code).
//
// Every rank holds a full copy of the parameters and runs forward/backward on its own micro-batch;
// the gradients are then averaged over the data-parallel group. The parameters are grouped into
// buckets in REVERSE registration order (backward produces the last layers' gradients first); each
// bucket is one contiguous fp32 buffer and every parameter's .grad is set to a view into it, so
// AccumulateGrad adds straight into the bucket (Megatron's main_grad buffers). A post-accumulate
// hook counts the parameters of a bucket that are ready; when the last one is, the bucket's async
// all_reduce (ZeRO-1: reduce_scatter) starts while the rest of backward runs.
//
// The train loop:
//   ddp.zero_grad();                         // zeros the buckets, keeps the views
//   for each micro-batch m:
//     ddp.set_last_microbatch(m == last);    // false: hooks only accumulate, no communication
//     loss(m).backward();
//   ddp.finish_grad_sync();                  // waits for (and, if needed, launches) every bucket
//   clip; optimizer.step();
//
// Contract (see docs/distributed.md, "Data parallelism and ZeRO-1"):
// - Gradients must stay views of the buckets: an optimizer must zero them in place
//   (optim::Optimizer::zero_grad(false) or ddp.zero_grad()), never set them to None. A hook that
//   finds a parameter's .grad replaced throws a td::Error naming the parameter.
// - Every rank constructs the DDP with the same parameters (same names, shapes, order) and
//   options; buckets are launched strictly in bucket order, so the collectives are issued in the
//   same order on every rank even when a bucket becomes ready early.
// - Unused parameters (no gradient in a backward) do not hang: their bucket is launched by
//   finish_grad_sync(), their gradient stays a (zero-filled) view, never None.
// - Averaging uses ReduceOp::Avg: an fp32 sum over ranks, then one division by the group size,
//   so the result is the mean of the ranks' gradients rounded as fp32 (for a power-of-two size
//   the division itself is exact).
// - ZeRO-1 mode (reduce_scatter=true): after finish_grad_sync() only this rank's shard of each
//   bucket (elements [rank*S, (rank+1)*S) of a bucket of padded size dp*S) holds the averaged
//   gradient; the rest of the buffer holds this rank's local sum and must not be read. Use
//   DistributedOptimizer (distributed_optimizer.h) for the update.
// - ZeRO-2 mode (shard_grads=true, with reduce_scatter): Note [ZeRO-2 gradient shards] in
//   data_parallel.cpp. Every micro-batch's buckets are reduce-scattered as they become ready
//   (set_last_microbatch is ignored) and summed into a persistent fp32 shard per bucket
//   (shard_grad(b)); the full bucket buffers are freed after each reduction and come back,
//   zeroed, when the next gradient arrives. After finish_grad_sync() the .grad views must not be
//   read (their storage is released); the shards hold the averaged gradient. Every rank's
//   backward must reach the same parameters (a data-dependent unused parameter would make the
//   ranks issue different collectives).
// - Parameters must be fp32 leaves that require grad, listed once each (tied weights once).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/grad_compression.h"
#include "tardelli/nn/module.h"

namespace td::distributed {

struct DDPOptions {
  int64_t bucket_bytes = 40'000'000;  // Megatron's default bucket size (fp32 bytes per bucket)
  bool overlap = true;                // launch a bucket from the hook as soon as it is ready
  bool reduce_scatter = false;        // ZeRO-1: reduce_scatter instead of all_reduce
  bool average = true;                // mean over ranks (false: sum)
  bool shard_grads = false;           // ZeRO-2 (needs reduce_scatter): per-micro-batch shards
  // Parameters (by name) placed in a bucket of their own, e.g. the pipeline-tied embedding, so
  // that its shard covers the same element range on every stage that holds a copy.
  std::vector<std::string> own_bucket = {};
  // Explicit buckets (ZeRO-3 units): indices into the parameter list, each parameter exactly
  // once; overrides bucket_bytes and own_bucket. Launch order is this order.
  std::vector<std::vector<size_t>> buckets = {};
  // Multiplies this rank's accumulated gradients just before the reduction (Megatron's
  // gradient_scaling_factor). Expert parallelism: the experts' DDP averages over the expert-
  // data-parallel group with 1 / ep, so that dense and expert gradients are both the mean over
  // all dp x ep ranks' tokens (Note [Expert gradients] in
  // python/tardelli/distributed/expert_parallel.py).
  double grad_scale = 1.0;
  // Compressed reduction (distributed/grad_compression.h: PowerSGD, top-k): each bucket is
  // handed to the compressor instead of all-reduced, on the DDP's worker thread in launch order
  // (overlapping backward); with reduce_scatter (ZeRO-1) this rank's shard is then taken from
  // the decompressed mean. Not with shard_grads (ZeRO-2/3). While buckets are in flight the
  // group must not be used from another thread.
  std::shared_ptr<GradCompressor> compressor = nullptr;
};

// Where one parameter lives in the buckets.
struct BucketParam {
  std::string name;
  Tensor param;
  size_t bucket = 0;
  int64_t offset = 0;  // first element of the parameter in its bucket's buffer
  int64_t numel = 0;
};

struct Bucket {
  Tensor buffer;               // fp32 [padded_numel], the .grad views point into it
  std::vector<size_t> params;  // indices into DistributedDataParallel::params()
  int64_t numel = 0;           // used elements (the rest is zero padding)
  int64_t padded_numel = 0;    // a multiple of the group size
  int64_t shard_numel = 0;     // padded_numel / group size: each rank's ZeRO-1 shard
  Tensor grad_shard;           // ZeRO-2: this rank's summed gradient shard [shard_numel]
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(nn::NamedTensors params, CommPtr dp, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // false: backward only accumulates into the buckets (gradient accumulation, no_sync);
  // true (the default): hooks launch each bucket's reduction when it is ready.
  void set_last_microbatch(bool last);
  bool is_last_microbatch() const;
  // Switches overlap on or off between backward passes (benchmarks interleave the two modes).
  void set_overlap(bool overlap);

  // Launches every bucket not launched yet (in bucket order), then waits for all of them. After
  // it returns every gradient is the average over ranks (ZeRO-1: every rank's own shard is).
  // Always communicates, whatever set_last_microbatch said.
  void finish_grad_sync();
  // True between finish_grad_sync() and the next backward hook or zero_grad().
  bool grads_synced() const;

  // Zeros every bucket (and padding); the .grad views are kept. Waits for in-flight buckets.
  // ZeRO-2: zeros the gradient shards and releases the bucket buffers.
  void zero_grad();

  // This rank's averaged gradient shard of bucket b ([shard_numel] fp32), valid after
  // finish_grad_sync() with reduce_scatter: ZeRO-1 a view of the bucket buffer at
  // [rank*S, (rank+1)*S), ZeRO-2 the persistent shard.
  Tensor shard_grad(size_t b) const;
  // Bytes of gradient buffers allocated right now (buckets not released + ZeRO-2 shards).
  int64_t grad_buffer_bytes() const;

  const CommPtr& comm() const;
  const DDPOptions& options() const;
  const std::vector<BucketParam>& params() const;
  const std::vector<Bucket>& buckets() const;
  // Index into params() of the parameter `p` (same TensorImpl), or -1.
  int64_t find_param(const Tensor& p) const;

  // Instrumentation (tests, benchmarks): collectives issued since construction, post-accumulate
  // hooks fired in the current/last synced backward, and for each bucket the number of hooks
  // that had fired when its reduction was launched (-1: not launched in this cycle).
  int64_t num_collectives() const;
  int64_t hooks_fired() const;
  std::vector<int64_t> launch_hook_counts() const;
  // Seconds spent inside Work::wait() by the last finish_grad_sync (communication not hidden).
  double last_wait_seconds() const;

  struct State;  // shared with the hooks (which may outlive this object)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace td::distributed
