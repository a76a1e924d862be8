// The training loop's gradient reduction and optimizer (python: the second half of
// trainer.build_job): DDP, ZeRO-1/2 (DistributedOptimizer over the DDP), ZeRO-3
// (FullyShardedDataParallel) and optimizer offload. Split from trainer.cpp.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/distributed/fully_sharded.h"
#include "tardelli/train/trainer.h"
#include "train_util.h"

namespace td::train {

namespace dist = td::distributed;

namespace detail {

namespace {

int tp_size_of(const models::GPT& m) {
  return m.parallelism() != nullptr ? m.parallelism()->tp_size() : 1;
}

int tp_rank_of(const models::GPT& m) {
  return m.parallelism() != nullptr ? m.parallelism()->tp_rank() : 0;
}

}  // namespace

bool counts_in_norm(const models::GPT& m, const std::string& name, bool tp) {
  if (name == "wte.weight" && !m.stage().pre) return false;
  const bool split = m.shard_spec(name).dim >= 0 && tp_size_of(m) > 1;
  return split || !tp || tp_rank_of(m) == 0;
}

}  // namespace detail

dist::CommPtr Trainer::reduction_group(const std::string& axes) const {
  return grid_->group(axes);
}

std::vector<bool> Trainer::counted_in_norm(const dist::DistributedDataParallel& ddp) const {
  std::vector<bool> counted;
  const bool tp = cfg_.tp > 1;
  for (const dist::BucketParam& bp : ddp.params()) {
    const models::GPT* owner = nullptr;
    for (const auto& ch : chunks_) {
      for (const auto& [n, p] : ch->named_parameters()) {
        if (n == bp.name) owner = ch.get();
      }
    }
    TD_CHECK(owner != nullptr, "train: no chunk holds parameter ", bp.name);
    counted.push_back(detail::counts_in_norm(*owner, bp.name, tp));
  }
  return counted;
}

void Trainer::build_reduction(const nn::NamedTensors& named,
                              const std::vector<optim::ParamGroup>& groups,
                              const optim::AdamWOptions& defaults) {
  const TrainConfig& c = cfg_;
  if (world_ != nullptr && c.zero == 3) {
    // ZeRO-3: parameters sharded over dp between uses, gathered per block (fully_sharded.h);
    // its DDP reduce-scatters each block's gradients into fp32 shards.
    fsdp_ = dist::FullyShardedDataParallel::shard(chunks_, reduction_group("dp"));
    ddp_ = &fsdp_->ddp();
  } else if (world_ != nullptr) {
    // Note [Data parallel step] (python/tardelli/train/trainer.py): gradients live in the DDP's
    // buckets; reductions start during the step's last backward (ZeRO-2: every micro-batch's).
    // Context parallelism: replicated parameters see only this rank's tokens, so their
    // gradients are averaged over dp x cp (Note [Context-parallel loss]).
    dist::DDPOptions o;
    o.bucket_bytes = std::max<int64_t>(1, std::llround(c.ddp_bucket_mb * 1e6));
    o.reduce_scatter = c.zero >= 1;
    o.shard_grads = c.zero == 2;
    if (c.zero == 2 && c.pp > 1) o.own_bucket = {"wte.weight"};
    ddp_owned_ = std::make_unique<dist::DistributedDataParallel>(
        named, reduction_group(c.cp > 1 ? "dp-cp" : "dp"), o);
    ddp_ = ddp_owned_.get();
  }
  if (c.zero > 0) {
    // Note [Optimizer offload] (distributed_optimizer.h): the shard's state in host memory.
    dist::ShardedOptimizerOptions so =
        fsdp_ != nullptr ? fsdp_->optimizer_options(c.offload_optimizer)
                         : dist::ShardedOptimizerOptions{.offload = c.offload_optimizer};
    zero_opt_ = std::make_unique<dist::DistributedOptimizer>(*ddp_, groups, defaults, so);
    if (mp_group_ != nullptr) zero_opt_->set_model_parallel(mp_group_, counted_in_norm(*ddp_));
  } else {
    adamw_ = std::make_unique<optim::AdamW>(groups, defaults);
  }
}

}  // namespace td::train
