// The training loop's gradient reduction, gradient norm and optimizer: DDP, ZeRO-1/2
// (DistributedOptimizer over the DDP), ZeRO-3 (FullyShardedDataParallel), expert parallelism's pair
// of DDPs and optimizers (python/tardelli/distributed/expert_parallel.py), optimizer offload,
// two-level reductions (reduction_group()) and gradient compression (make_compressor()). Split from
// trainer.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/core/error.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/distributed/fully_sharded.h"
#include "tardelli/distributed/grad_compression.h"
#include "tardelli/distributed/hierarchical.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/join.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/train/trainer.h"
#include "train_util.h"

namespace td::train {

namespace dist = td::distributed;
using detail::counts_in_norm;

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

namespace {

// Ranks per node as the launcher tells it (Open MPI, MPICH, SLURM), else `fallback`
// (python: td.distributed.ranks_per_node_from_env).
int ranks_per_node_from_env(int fallback) {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    const std::string s = v;
    if (std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
        s.size() < 10 && std::stoi(s) > 0) {
      return std::stoi(s);
    }
  }
  return fallback;
}

}  // namespace

dist::CommPtr Trainer::reduction_group(const std::string& axes) const {
  const dist::CommPtr& g = grid_->group(axes);
  if (!cfg_.hierarchical_reduce) return g;
  // Note [Two-level collectives] (distributed/hierarchical.h).
  const int rpn = cfg_.ranks_per_node > 0 ? static_cast<int>(cfg_.ranks_per_node)
                                          : ranks_per_node_from_env(world_->size());
  return dist::hierarchical(g, dist::nodes_of(grid_->group_ranks(axes), rpn));
}

std::shared_ptr<dist::GradCompressor> Trainer::make_compressor() {
  // Note [Error feedback] (distributed/grad_compression.h): each DDP keeps its own.
  std::shared_ptr<dist::GradCompressor> out;
  const auto seed = static_cast<uint64_t>(cfg_.seed);
  if (cfg_.grad_compression == "powersgd") {
    out = dist::powersgd_compressor(cfg_.powersgd_rank, seed);
  } else if (cfg_.grad_compression == "topk" || cfg_.grad_compression == "randomk") {
    out = dist::topk_compressor(cfg_.topk_ratio, cfg_.grad_compression == "randomk", seed);
  }
  if (out != nullptr) compressors_.push_back(out);
  return out;
}

// The communicators a DDP's reductions run on (and their cross-node parts), each once.
void Trainer::add_reduce_comm(const dist::CommPtr& g) {
  if (std::find(reduce_comms_.begin(), reduce_comms_.end(), g) != reduce_comms_.end()) return;
  reduce_comms_.push_back(g);
  if (dist::CommPtr cross = dist::cross_node_group(g)) cross_comms_.push_back(cross);
}

std::vector<dist::DistributedDataParallel*> Trainer::ddp_parts() const {
  std::vector<dist::DistributedDataParallel*> out;
  if (ddp_ != nullptr) out.push_back(ddp_);
  if (expert_ddp_ != nullptr) out.push_back(expert_ddp_.get());
  return out;
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
  // The options every DDP of the run shares (the trainer's bucket size and ZeRO stage; the
  // pipeline-tied table in a bucket of its own under ZeRO-2), each with its own compressor.
  auto ddp_options = [&] {
    dist::DDPOptions o;
    o.bucket_bytes = std::max<int64_t>(1, std::llround(c.ddp_bucket_mb * 1e6));
    o.reduce_scatter = c.zero >= 1;
    o.shard_grads = c.zero == 2;
    if (c.zero == 2 && c.pp > 1) o.own_bucket = {"wte.weight"};
    o.compressor = make_compressor();
    return o;
  };
  if (world_ != nullptr && c.zero == 3) {
    // ZeRO-3: parameters sharded over dp between uses, gathered per block (fully_sharded.h);
    // its DDP reduce-scatters each block's gradients into fp32 shards.
    fsdp_ = dist::FullyShardedDataParallel::shard(chunks_, reduction_group("dp"));
    ddp_ = &fsdp_->ddp();
  } else if (world_ != nullptr && c.ep > 1) {
    // Dense gradients averaged over dp, the experts' over edp with 1 / ep (Note [Expert
    // gradients] in python/tardelli/distributed/expert_parallel.py); the experts' reduction is
    // launched after backward (overlap off), so every rank issues both groups' collectives in
    // the same order.
    nn::NamedTensors dense, experts;
    for (const auto& [n, p] : named) {
      (n.find(".mlp.experts.") != std::string::npos ? experts : dense).emplace_back(n, p);
    }
    TD_CHECK(!experts.empty(), "train: --ep ", c.ep, ": the model has no expert parameters");
    const dist::CommPtr dense_group = reduction_group("dp");
    const dist::CommPtr expert_group = reduction_group("edp");
    dist::DDPOptions o = ddp_options();
    ddp_owned_ = std::make_unique<dist::DistributedDataParallel>(dense, dense_group, o);
    ddp_ = ddp_owned_.get();
    o.own_bucket = {};
    o.overlap = false;
    o.grad_scale = 1.0 / static_cast<double>(c.ep);
    o.compressor = make_compressor();
    expert_ddp_ = std::make_unique<dist::DistributedDataParallel>(experts, expert_group, o);
  } else if (world_ != nullptr) {
    // Note [Data parallel step] (src/train/trainer.cpp): gradients live in the DDP's
    // buckets; reductions start during the step's last backward (ZeRO-2: every micro-batch's).
    // Context parallelism: replicated parameters see only this rank's tokens, so their
    // gradients are averaged over dp x cp (Note [Context-parallel loss]).
    const dist::DDPOptions o = ddp_options();  // its compressor first (the order of old runs)
    ddp_owned_ = std::make_unique<dist::DistributedDataParallel>(
        named, reduction_group(c.cp > 1 ? "dp-cp" : "dp"), o);
    ddp_ = ddp_owned_.get();
  }
  for (dist::DistributedDataParallel* d : ddp_parts()) add_reduce_comm(d->comm());
  if (c.zero > 0 && expert_ddp_ != nullptr) {
    // python: ExpertDistributedOptimizer, one sharded optimizer per DDP over its part of each
    // parameter group (empty parts dropped); the experts' norm is summed over tp-ep-pp.
    auto part = [&](const dist::DistributedDataParallel& d) {
      std::vector<optim::ParamGroup> out;
      for (const optim::ParamGroup& g : groups) {
        optim::ParamGroup mine = g;
        mine.params.clear();
        for (const Tensor& p : g.params) {
          if (d.find_param(p) >= 0) mine.params.push_back(p);
        }
        if (!mine.params.empty()) out.push_back(std::move(mine));
      }
      return out;
    };
    const dist::ShardedOptimizerOptions so{.offload = c.offload_optimizer};
    zero_opt_ = std::make_unique<dist::DistributedOptimizer>(*ddp_, part(*ddp_), defaults, so);
    expert_opt_ = std::make_unique<dist::DistributedOptimizer>(*expert_ddp_, part(*expert_ddp_),
                                                               defaults, so);
    expert_opt_->set_model_parallel(expert_group_, counted_in_norm(*expert_ddp_));
    if (mp_group_ != nullptr) zero_opt_->set_model_parallel(mp_group_, counted_in_norm(*ddp_));
  } else if (c.zero > 0) {
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

double Trainer::grad_norm_clipped(double max_norm) {
  if (zero_opt_ != nullptr && expert_opt_ == nullptr) {
    return std::isfinite(max_norm) ? zero_opt_->clip_grad_norm(max_norm) : zero_opt_->grad_norm();
  }
  if (zero_opt_ != nullptr) {
    // ExpertDistributedOptimizer: one norm over both optimizers' shards; Python squares each
    // part with float ** 2, which calls libm's pow (a run-time exponent makes ours call it too).
    static volatile double two = 2.0;
    const double norm =
        std::sqrt(std::pow(zero_opt_->grad_norm(), two) + std::pow(expert_opt_->grad_norm(), two));
    if (std::isfinite(norm) && std::isfinite(max_norm)) {
      const double coef = max_norm / (norm + 1e-6);
      if (coef < 1.0) {
        zero_opt_->scale_grads(coef);
        expert_opt_->scale_grads(coef);
      }
    }
    return norm;
  }
  autograd::NoGradGuard no_grad;
  if (mp_group_ != nullptr || expert_group_ != nullptr) {
    // The full model's norm under a model-parallel layout (model_parallel.clip_grad_norm_): each
    // counted gradient's sum of squares in fp32, added in double, summed over tp-pp; the
    // experts' over tp-ep-pp under expert parallelism.
    const bool tp = cfg_.tp > 1;
    double local = 0, local_experts = 0;
    for (const auto& ch : chunks_) {
      for (const auto& [name, p] : ch->named_parameters()) {
        const Tensor g = p.grad();
        if (!g.defined() || !counts_in_norm(*ch, name, tp)) continue;
        const double sq = sum(mul(g, g)).item<double>();
        if (expert_group_ != nullptr && name.find(".mlp.experts.") != std::string::npos) {
          local_experts += sq;
        } else {
          local += sq;
        }
      }
    }
    double total = mp_group_ != nullptr && mp_group_->size() > 1
                       ? dist::sum_over_ranks(local, mp_group_)
                       : local;
    if (expert_group_ != nullptr) {
      total += expert_group_->size() > 1 ? dist::sum_over_ranks(local_experts, expert_group_)
                                         : local_experts;
    }
    const double norm = std::sqrt(total);
    if (std::isfinite(norm) && std::isfinite(max_norm)) {
      const double coef = max_norm / (norm + 1e-6);
      if (coef < 1.0) {
        for (const Tensor& p : parameters()) {
          Tensor g = p.grad();
          if (g.defined()) mul_(g, coef);
        }
      }
    }
    return norm;
  }
  // One process: torch's clip_grad_norm_ (td.nn.utils): the norm of the per-tensor fp32 norms,
  // and the coefficient max_norm / (norm + 1e-6) clamped to 1 computed as an fp32 tensor.
  TensorList grads;
  for (const Tensor& p : parameters()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  TensorList norms;
  for (const Tensor& g : grads) norms.push_back(norm(g.detach().to(DType::Float32)));
  const Tensor total = norm(stack(norms, 0));
  const double coef = clamp(rdiv(add(total, 1e-6), max_norm), std::nullopt, 1.0).item<double>();
  for (Tensor& g : grads) mul_(g, coef);
  return total.item<double>();
}

}  // namespace td::train
