#include "tardelli/distributed/distributed_optimizer.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "ops/cpu/loops.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/adamw.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {

namespace {

const char* const kOptionKeys[] = {"beta1", "beta2", "eps"};

std::string range_key(const std::string& name, const char* what, int64_t a, int64_t b) {
  return detail::str_cat(name, ".", what, "[", a, ":", b, "]");
}

// Zeros [numel] fp32 on `where`; on the host in page-locked memory when `pinned` (Note
// [Optimizer offload]: the state of a GPU run's shard, copied to and from the device each step).
Tensor state_buffer(int64_t numel, Device where, bool pinned) {
  if (!pinned) return zeros({numel}, {DType::Float32, where});
  const size_t nbytes = static_cast<size_t>(numel) * 4;
  DataPtr bytes = allocate_pinned_host(nbytes);
  auto deleter = bytes.get_deleter();
  Storage st = Storage::wrap(bytes.release(), nbytes, kCPU, std::move(deleter));
  Tensor t = Tensor::make(std::move(st), {numel}, {1}, 0, DType::Float32);
  t.zero_();
  return t;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(DistributedDataParallel& ddp,
                                           std::vector<optim::ParamGroup> groups,
                                           const optim::AdamWOptions& defaults,
                                           ShardedOptimizerOptions options)
    : ddp_(ddp), options_(std::move(options)), groups_(std::move(groups)) {
  TD_CHECK(ddp.options().reduce_scatter,
           "DistributedOptimizer: the DistributedDataParallel must "
           "be built with reduce_scatter=true (ZeRO-1 reduces each bucket to its shard owner)");
  TD_CHECK(!groups_.empty(), "DistributedOptimizer: no parameter groups");
  const auto& params = ddp.params();
  std::vector<int64_t> group_of(params.size(), -1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto& grp = groups_[g];
    if (!grp.lr) grp.lr = defaults.lr;
    if (!grp.weight_decay) grp.weight_decay = defaults.weight_decay;
    for (const auto& [k, v] : grp.options) {
      TD_CHECK(std::find_if(std::begin(kOptionKeys), std::end(kOptionKeys),
                            [&](const char* o) { return k == o; }) != std::end(kOptionKeys),
               "DistributedOptimizer: unknown option '", k, "' in group ", g,
               " (AdamW knows beta1, beta2, eps)");
    }
    grp.options.try_emplace("beta1", defaults.beta1);
    grp.options.try_emplace("beta2", defaults.beta2);
    grp.options.try_emplace("eps", defaults.eps);
    const double b1 = grp.option("beta1"), b2 = grp.option("beta2");
    TD_CHECK(*grp.lr >= 0, "DistributedOptimizer: invalid learning rate ", *grp.lr);
    TD_CHECK(*grp.weight_decay >= 0, "DistributedOptimizer: invalid weight_decay ",
             *grp.weight_decay);
    TD_CHECK(grp.option("eps") >= 0, "DistributedOptimizer: invalid epsilon ", grp.option("eps"));
    TD_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "DistributedOptimizer: invalid betas (", b1,
             ", ", b2, "), each must be in [0, 1)");
    for (const Tensor& p : grp.params) {
      const int64_t i = ddp.find_param(p);
      TD_CHECK(i >= 0, "DistributedOptimizer: group ", g, " holds a tensor ",
               p.defined() ? describe(p) : std::string("(undefined)"),
               " that is not a parameter of the DistributedDataParallel");
      TD_CHECK(group_of[i] < 0, "DistributedOptimizer: parameter '", params[i].name,
               "' appears in more than one group (", group_of[i], " and ", g, ")");
      group_of[i] = static_cast<int64_t>(g);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    TD_CHECK(group_of[i] >= 0, "DistributedOptimizer: parameter '", params[i].name,
             "' is in no group; every DDP parameter must belong to exactly one group");
  }

  // This rank's shard of each bucket, cut at parameter boundaries.
  autograd::NoGradGuard no_grad;
  const int64_t r = ddp.comm()->rank();
  const auto& buckets = ddp.buckets();
  const bool zero3 = !options_.param_shards.empty();
  if (zero3) {
    TD_CHECK(options_.param_shards.size() == buckets.size(),
             "DistributedOptimizer: ", options_.param_shards.size(), " parameter shards for ",
             buckets.size(), " buckets (ZeRO-3 needs one per bucket)");
    for (size_t b = 0; b < buckets.size(); ++b) {
      TD_CHECK(options_.param_shards[b].numel() == buckets[b].shard_numel &&
                   options_.param_shards[b].dtype() == DType::Float32,
               "DistributedOptimizer: parameter shard ", b, " is ",
               describe(options_.param_shards[b]), ", expected float32 [", buckets[b].shard_numel,
               "] (rank ", r, ")");
    }
  }
  const Device host = kCPU;
  // Note [Masters are the parameters]: without offload, the fp32 master of a piece is the
  // parameter's own slice (ZeRO-1/2) or the parameter shard (ZeRO-3), updated in place, as
  // Megatron's distributed optimizer keeps no main-param copy of fp32 parameters: 4 bytes per
  // shard element less. (The ZeRO-1/2 all-gather still stages the shard contiguously.) A
  // parameter in another dtype, or offload, keeps a separate fp32 copy.
  alias_ = !options_.offload;
  for (const auto& p : params) {
    if (p.param.dtype() != DType::Float32 || !p.param.is_contiguous()) alias_ = false;
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bk = buckets[b];
    const int64_t lo = r * bk.shard_numel, hi = lo + bk.shard_numel;
    for (size_t i : bk.params) {
      const BucketParam& p = params[i];
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (a >= e) continue;
      Piece pc;
      pc.param = i;
      pc.group = static_cast<size_t>(group_of[i]);
      pc.bucket = b;
      pc.start = a - p.offset;
      pc.numel = e - a;
      pc.bucket_offset = a;
      Tensor src = zero3 ? options_.param_shards[b].narrow(0, a - lo, pc.numel)
                         : p.param.reshape({-1}).narrow(0, pc.start, pc.numel);
      const Device where = options_.offload ? host : p.param.device();
      const bool pinned = options_.offload && p.param.device().is_cuda();
      pinned_ = pinned_ || pinned;
      // Note [Masters are the parameters].
      if (alias_) {
        pc.master = src;
      } else {
        pc.master = state_buffer(pc.numel, where, pinned);
        copy_into(pc.master, src);
      }
      pc.exp_avg = state_buffer(pc.numel, where, pinned);
      pc.exp_avg_sq = state_buffer(pc.numel, where, pinned);
      pc.grad = ddp.shard_grad(b).narrow(0, a - lo, pc.numel);
      if (options_.offload) pc.host_grad = state_buffer(pc.numel, host, pinned);
      pieces_.push_back(std::move(pc));
    }
    const Device dev = bk.buffer.device();
    shard_in_.push_back(zero3 ? options_.param_shards[b]
                              : zeros({bk.shard_numel}, {DType::Float32, dev}));
  }
  // Pieces in bucket order, and within a bucket in offset order: sorted for the norm's order.
  std::sort(pieces_.begin(), pieces_.end(), [](const Piece& x, const Piece& y) {
    return x.bucket != y.bucket ? x.bucket < y.bucket : x.bucket_offset < y.bucket_offset;
  });
}

void DistributedOptimizer::step() {
  TD_CHECK(ddp_.grads_synced(),
           "DistributedOptimizer.step: the gradients are not synchronized; "
           "call ddp.finish_grad_sync() after the last backward");
  autograd::NoGradGuard no_grad;
  ++step_;
  // Note [Optimizer offload]: the shard's gradient goes to the host first.
  if (options_.offload) {
    for (auto& pc : pieces_) copy_into(pc.host_grad, pc.grad);
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& grp = groups_[g];
    TensorList ps, gs, ms, vs;
    for (auto& pc : pieces_) {
      if (pc.group != g) continue;
      ps.push_back(pc.master);
      gs.push_back(options_.offload ? pc.host_grad : pc.grad);
      ms.push_back(pc.exp_avg);
      vs.push_back(pc.exp_avg_sq);
    }
    if (ps.empty()) continue;
    AdamWConfig cfg;
    cfg.lr = *grp.lr;
    cfg.weight_decay = *grp.weight_decay;
    cfg.beta1 = grp.option("beta1");
    cfg.beta2 = grp.option("beta2");
    cfg.eps = grp.option("eps");
    cfg.step = step_;
    adamw_step(ps, gs, ms, vs, cfg);
  }

  // Note [Parameter all-gather]: the gathers are pipelined two deep: bucket b+1's transfer
  // overlaps the copy of bucket b into the parameters, and at most two full buckets of gather
  // buffer exist at once (they are freed after the copy, so ZeRO-1/2 keep no full-size buffer
  // between steps).
  const auto& buckets = ddp_.buckets();
  const auto& params = ddp_.params();
  const bool zero3 = !options_.param_shards.empty();
  if (!(zero3 && alias_)) copy_masters_to_shards();  // else updated in place
  if (zero3) {                                       // gathered when next used
    if (options_.param_shards_written) options_.param_shards_written();
    return;
  }
  std::vector<WorkPtr> work(buckets.size());
  std::vector<Tensor> gathered(buckets.size());
  const auto finish = [&](size_t b) {
    work[b]->wait();
    for (size_t i : buckets[b].params) {
      const BucketParam& p = params[i];
      Tensor dst = p.param.detach();
      copy_into(dst, gathered[b].narrow(0, p.offset, p.numel).view(p.param.sizes()));
    }
    gathered[b] = Tensor();
  };
  for (size_t b = 0; b < buckets.size(); ++b) {
    gathered[b] = Tensor::empty({buckets[b].padded_numel}, DType::Float32, shard_in_[b].device());
    work[b] = ddp_.comm()->all_gather(gathered[b], shard_in_[b], /*async_op=*/true);
    if (b > 0) finish(b - 1);
  }
  finish(buckets.size() - 1);
}

void DistributedOptimizer::zero_grad() {
  ddp_.zero_grad();
}

double DistributedOptimizer::local_sum_of_squares() const {
  // Note [Deterministic grad norm] (src/optim/clip_grad.cpp): fixed chunks, combined in order.
  struct Chunk {
    size_t k;
    int64_t b, e;
  };
  constexpr int64_t kChunk = 16384;
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    if (!counted_.empty() && !counted_[pieces_[k].param]) continue;
    for (int64_t b = 0; b < pieces_[k].numel; b += kChunk) {
      chunks.push_back({k, b, std::min(pieces_[k].numel, b + kChunk)});
    }
  }
  std::vector<double> partial(chunks.size(), 0.0);
  cpu::parallel_for(static_cast<int64_t>(chunks.size()), 2, [&](int64_t b, int64_t e) {
    for (int64_t ci = b; ci < e; ++ci) {
      const Chunk& ch = chunks[ci];
      const float* g = pieces_[ch.k].grad.data_ptr<float>();
      double acc = 0;
      for (int64_t i = ch.b; i < ch.e; ++i) acc += static_cast<double>(g[i]) * g[i];
      partial[ci] = acc;
    }
  });
  double acc = 0;
  for (double x : partial) acc += x;
  return acc;
}

double DistributedOptimizer::grad_norm() {
  TD_CHECK(ddp_.grads_synced(),
           "DistributedOptimizer.grad_norm: the gradients are not "
           "synchronized; call ddp.finish_grad_sync() after the last backward");
  double total = sum_over_ranks(local_sum_of_squares(), ddp_.comm());
  if (model_parallel_) total = sum_over_ranks(total, model_parallel_);
  return std::sqrt(total);
}

void DistributedOptimizer::set_model_parallel(CommPtr model_parallel, std::vector<bool> counted) {
  TD_CHECK(model_parallel != nullptr, "DistributedOptimizer.set_model_parallel: null group");
  TD_CHECK(counted.size() == ddp_.params().size(),
           "DistributedOptimizer.set_model_parallel: ", counted.size(), " flags for ",
           ddp_.params().size(), " parameters");
  model_parallel_ = std::move(model_parallel);
  counted_ = std::move(counted);
}

double DistributedOptimizer::clip_grad_norm(double max_norm) {
  TD_CHECK(max_norm >= 0, "DistributedOptimizer.clip_grad_norm: max_norm must be >= 0, got ",
           max_norm);
  const double total = grad_norm();
  if (!std::isfinite(total)) return total;
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    autograd::NoGradGuard no_grad;
    for (auto& pc : pieces_) mul_(pc.grad, coef);
  }
  return total;
}

void DistributedOptimizer::scale_grads(double factor) {
  autograd::NoGradGuard no_grad;
  for (auto& pc : pieces_) mul_(pc.grad, factor);
}

void DistributedOptimizer::set_lr(double lr) {
  TD_CHECK(lr >= 0, "DistributedOptimizer.set_lr: invalid learning rate ", lr);
  for (auto& g : groups_) g.lr = lr;
}

int64_t DistributedOptimizer::host_state_bytes() const {
  if (!options_.offload) return 0;
  int64_t bytes = 0;
  for (const auto& pc : pieces_) {
    bytes += static_cast<int64_t>(pc.master.nbytes() + pc.exp_avg.nbytes() +
                                  pc.exp_avg_sq.nbytes() + pc.host_grad.nbytes());
  }
  return bytes;
}

int64_t DistributedOptimizer::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (const auto& pc : pieces_) {
    const size_t master = alias_ ? 0 : pc.master.nbytes();
    bytes += static_cast<int64_t>(master + pc.exp_avg.nbytes() + pc.exp_avg_sq.nbytes());
  }
  return bytes;
}

bool DistributedOptimizer::masters_are_params() const {
  return alias_;
}

std::map<std::string, Tensor> DistributedOptimizer::named_state() const {
  std::map<std::string, Tensor> out;
  const auto& params = ddp_.params();
  for (const auto& pc : pieces_) {
    const std::string& n = params[pc.param].name;
    const int64_t a = pc.start, b = pc.start + pc.numel;
    out[range_key(n, "master", a, b)] = pc.master;
    out[range_key(n, "exp_avg", a, b)] = pc.exp_avg;
    out[range_key(n, "exp_avg_sq", a, b)] = pc.exp_avg_sq;
  }
  out["step"] = full({1}, static_cast<double>(step_), {DType::Int64});
  return out;
}

void DistributedOptimizer::load_named_state(const std::map<std::string, Tensor>& state) {
  const auto mine = named_state();
  std::set<std::string> missing, unexpected;
  for (const auto& [k, v] : mine) {
    if (!state.count(k)) missing.insert(k);
  }
  for (const auto& [k, v] : state) {
    if (!mine.count(k)) unexpected.insert(k);
  }
  auto join = [](const std::set<std::string>& s) {
    std::string r;
    for (const auto& k : s) r += (r.empty() ? "" : ", ") + k;
    return r.empty() ? std::string("none") : r;
  };
  TD_CHECK(missing.empty() && unexpected.empty(),
           "DistributedOptimizer.load_named_state: the "
           "keys differ from this rank's shard (same dp size and bucket layout needed). Missing: ",
           join(missing), ". Unexpected: ", join(unexpected), ".");
  for (const auto& [k, dst] : mine) {
    const Tensor& src = state.at(k);
    TD_CHECK(src.numel() == dst.numel(), "DistributedOptimizer.load_named_state: '", k, "' has ",
             src.numel(), " elements, expected ", dst.numel());
  }
  autograd::NoGradGuard no_grad;
  for (const auto& [k, dst] : mine) {
    if (k == "step") continue;
    copy_into(dst, state.at(k).reshape({-1}));
  }
  step_ = static_cast<int64_t>(std::llround(state.at("step").item_double()));
}

void DistributedOptimizer::sync_master_from_params() {
  autograd::NoGradGuard no_grad;
  const auto& params = ddp_.params();
  if (alias_) return;  // the masters are the parameters (or their shards)
  const auto& buckets = ddp_.buckets();
  const int64_t r = ddp_.comm()->rank();
  for (auto& pc : pieces_) {
    if (!options_.param_shards.empty()) {
      const int64_t lo = r * buckets[pc.bucket].shard_numel;
      copy_into(pc.master, shard_in_[pc.bucket].narrow(0, pc.bucket_offset - lo, pc.numel));
      continue;
    }
    copy_into(pc.master, params[pc.param].param.reshape({-1}).narrow(0, pc.start, pc.numel));
  }
}

void DistributedOptimizer::write_masters_to_param_shards() {
  TD_CHECK(!options_.param_shards.empty(),
           "DistributedOptimizer.write_masters_to_param_shards: only under ZeRO-3");
  autograd::NoGradGuard no_grad;
  if (!alias_) copy_masters_to_shards();  // else loaded in place
  if (options_.param_shards_written) options_.param_shards_written();
}

void DistributedOptimizer::copy_masters_to_shards() {
  const auto& buckets = ddp_.buckets();
  const int64_t r = ddp_.comm()->rank();
  for (const auto& pc : pieces_) {
    const int64_t lo = r * buckets[pc.bucket].shard_numel;
    copy_into(shard_in_[pc.bucket].narrow(0, pc.bucket_offset - lo, pc.numel), pc.master);
  }
}

}  // namespace td::distributed
