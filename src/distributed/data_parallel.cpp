#include "tardelli/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {

// Note [DDP state and hooks]: the post-accumulate hooks live in the parameters' autograd
// metadata, which outlives this object (hooks cannot be removed). They hold a weak_ptr to the
// State, so a hook that fires after the DDP is gone does nothing, and the DDP itself could be
// moved without the hooks noticing. A mutex guards the state in case the engine runs
// AccumulateGrad on another thread.
struct DistributedDataParallel::State {
  CommPtr comm;
  DDPOptions opt;
  std::vector<BucketParam> params;
  std::vector<Bucket> buckets;
  std::vector<Tensor> rs_out;  // ZeRO-1: each bucket's reduce_scatter output [shard_numel]
  std::unordered_map<const TensorImpl*, size_t> index;

  // The current sync cycle (from the first hook of the last micro-batch to finish_grad_sync).
  bool cycle_open = false;
  std::vector<char> param_ready;
  std::vector<int64_t> pending;  // per bucket: parameters not ready yet
  std::vector<char> bucket_ready;
  std::vector<WorkPtr> work;
  size_t next_launch = 0;  // buckets launch strictly in order (Note [Bucket launch order])

  bool last_microbatch = true;
  bool synced = false;
  int64_t collectives = 0;
  int64_t hooks = 0;
  std::vector<int64_t> launch_hooks;
  double wait_seconds = 0;
  std::mutex mu;

  ReduceOp op() const { return opt.average ? ReduceOp::Avg : ReduceOp::Sum; }

  void open_cycle() {
    if (cycle_open) return;
    cycle_open = true;
    hooks = 0;
    std::fill(param_ready.begin(), param_ready.end(), 0);
    std::fill(bucket_ready.begin(), bucket_ready.end(), 0);
    std::fill(launch_hooks.begin(), launch_hooks.end(), -1);
    for (size_t b = 0; b < buckets.size(); ++b) {
      pending[b] = static_cast<int64_t>(buckets[b].params.size());
      work[b].reset();
    }
    next_launch = 0;
  }

  Tensor grad_view(size_t i) const {
    const BucketParam& p = params[i];
    return buckets[p.bucket].buffer.narrow(0, p.offset, p.numel).view(p.param.sizes());
  }

  // Note [Gradients stay views]: everything rests on .grad aliasing the bucket. An optimizer
  // that sets grads to None (torch's zero_grad default) makes AccumulateGrad allocate a fresh
  // tensor, which the bucket would never see: a silent wrong update. We check instead.
  void check_view(size_t i) const {
    const BucketParam& p = params[i];
    const Tensor& buf = buckets[p.bucket].buffer;
    Tensor g = p.param.grad();
    TD_CHECK(g.defined() && g.shares_storage(buf) &&
                 g.storage_offset() == buf.storage_offset() + p.offset && g.is_contiguous(),
             "DistributedDataParallel: the gradient of parameter '", p.name,
             "' is no longer a view of its gradient bucket (was it set to None or replaced, e.g. "
             "by optimizer.zero_grad(set_to_none=True) or backward(create_graph=True)?). Zero "
             "gradients with ddp.zero_grad() or zero_grad(set_to_none=False).");
  }

  void launch(size_t b) {
    Bucket& bk = buckets[b];
    if (opt.reduce_scatter) {
      work[b] = comm->reduce_scatter(rs_out[b], bk.buffer, op(), /*async_op=*/true);
    } else {
      work[b] = comm->all_reduce(bk.buffer, op(), /*async_op=*/true);
    }
    ++collectives;
    launch_hooks[b] = hooks;
  }

  // Note [Bucket launch order]: collectives must be issued in the same order on every rank.
  // Buckets usually become ready in order (reverse registration = backward order), but a rank
  // whose micro-batch leaves a parameter unused, or an engine order that differs, could make
  // bucket 2 ready before bucket 1. Launching only the ready prefix keeps the order fixed.
  void launch_ready_prefix() {
    while (next_launch < buckets.size() && bucket_ready[next_launch]) launch(next_launch++);
  }

  void on_grad_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    synced = false;
    if (!last_microbatch) return;  // accumulation only
    open_cycle();
    check_view(i);
    const BucketParam& p = params[i];
    TD_CHECK(!work[p.bucket], "DistributedDataParallel: parameter '", p.name,
             "' received another gradient after its bucket's reduction was launched. For "
             "gradient accumulation call set_last_microbatch(false) (no_sync) for every "
             "micro-batch but the last, and finish_grad_sync() before the next backward.");
    if (param_ready[i]) return;  // a second backward before launch: already counted
    param_ready[i] = 1;
    ++hooks;
    if (--pending[p.bucket] == 0) bucket_ready[p.bucket] = 1;
    if (opt.overlap) launch_ready_prefix();
  }

  // Waits for every launched bucket; returns the seconds spent waiting.
  double wait_all() {
    auto t0 = std::chrono::steady_clock::now();
    for (auto& w : work) {
      if (w) w->wait();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

DistributedDataParallel::DistributedDataParallel(nn::NamedTensors params, CommPtr dp,
                                                 DDPOptions options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  TD_CHECK(dp != nullptr, "DistributedDataParallel: the data-parallel communicator is null");
  TD_CHECK(options.bucket_bytes > 0, "DistributedDataParallel: bucket_bytes must be > 0, got ",
           options.bucket_bytes);
  TD_CHECK(!params.empty(), "DistributedDataParallel: no parameters");
  s.comm = std::move(dp);
  s.opt = options;
  const int64_t world = s.comm->size();

  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    TD_CHECK(p.defined(), "DistributedDataParallel: parameter '", name, "' is undefined");
    TD_CHECK(p.dtype() == DType::Float32, "DistributedDataParallel: parameter '", name, "' is ",
             describe(p), "; only float32 parameters are supported (fp32 gradient buckets)");
    TD_CHECK(p.is_leaf() && p.requires_grad(), "DistributedDataParallel: parameter '", name,
             "' must be a leaf tensor that requires grad, got ", describe(p));
    auto [it, fresh] = s.index.emplace(p.impl(), i);
    TD_CHECK(fresh, "DistributedDataParallel: parameters '", params[it->second].first, "' and '",
             name, "' are the same tensor; list tied parameters once");
    s.params.push_back({name, p, 0, 0, p.numel()});
  }

  // Buckets in reverse registration order, each closed once it reaches bucket_bytes (so a
  // parameter larger than a bucket gets a bucket of its own), padded to a multiple of the
  // group size so that reduce_scatter splits it evenly.
  std::vector<std::vector<size_t>> groups(1);
  int64_t bytes = 0;
  for (size_t k = s.params.size(); k-- > 0;) {
    groups.back().push_back(k);
    bytes += s.params[k].numel * static_cast<int64_t>(sizeof(float));
    if (bytes >= s.opt.bucket_bytes && k > 0) {
      groups.emplace_back();
      bytes = 0;
    }
  }
  autograd::NoGradGuard no_grad;
  for (auto& members : groups) {
    Bucket bk;
    bk.params = members;
    for (size_t i : members) {
      s.params[i].bucket = s.buckets.size();
      s.params[i].offset = bk.numel;
      bk.numel += s.params[i].numel;
    }
    bk.padded_numel = std::max<int64_t>(1, (bk.numel + world - 1) / world) * world;
    bk.shard_numel = bk.padded_numel / world;
    bk.buffer = zeros({bk.padded_numel}, {DType::Float32, s.params[members[0]].param.device()});
    if (s.opt.reduce_scatter) {
      s.rs_out.push_back(zeros({bk.shard_numel}, {DType::Float32, bk.buffer.device()}));
    }
    s.buckets.push_back(std::move(bk));
  }
  const size_t nb = s.buckets.size();
  s.param_ready.assign(s.params.size(), 0);
  s.pending.assign(nb, 0);
  s.bucket_ready.assign(nb, 0);
  s.work.assign(nb, nullptr);
  s.launch_hooks.assign(nb, -1);

  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const Tensor& p = s.params[i].param;
    Tensor view = s.grad_view(i);
    Tensor old = p.grad();
    if (old.defined()) copy_into(view, old);  // keep a gradient accumulated before wrapping
    p.set_grad(view);
    p.register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto st = weak.lock()) st->on_grad_ready(i);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  // Buffers referenced by in-flight collectives are kept alive by their Work; waiting keeps
  // the communicator's queue in step with the other ranks.
  try {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->wait_all();
  } catch (...) {
  }
}

void DistributedDataParallel::set_last_microbatch(bool last) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->last_microbatch = last;
}

bool DistributedDataParallel::is_last_microbatch() const {
  return state_->last_microbatch;
}

void DistributedDataParallel::set_overlap(bool overlap) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->opt.overlap = overlap;
}

void DistributedDataParallel::finish_grad_sync() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.open_cycle();
  for (size_t i = 0; i < s.params.size(); ++i) s.check_view(i);
  // Buckets whose parameters did not all get a gradient (unused parameters) and, without
  // overlap, every bucket are launched here, in order.
  std::fill(s.bucket_ready.begin(), s.bucket_ready.end(), 1);
  s.launch_ready_prefix();
  s.wait_seconds = s.wait_all();
  if (s.opt.reduce_scatter) {
    autograd::NoGradGuard no_grad;
    const int64_t r = s.comm->rank();
    for (size_t b = 0; b < s.buckets.size(); ++b) {
      Bucket& bk = s.buckets[b];
      copy_into(bk.buffer.narrow(0, r * bk.shard_numel, bk.shard_numel), s.rs_out[b]);
    }
  }
  std::fill(s.work.begin(), s.work.end(), nullptr);
  s.cycle_open = false;
  s.synced = true;
}

bool DistributedDataParallel::grads_synced() const {
  return state_->synced;
}

void DistributedDataParallel::zero_grad() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.wait_all();  // never zero a buffer a collective is still reading or writing
  std::fill(s.work.begin(), s.work.end(), nullptr);
  s.cycle_open = false;
  s.synced = false;
  autograd::NoGradGuard no_grad;
  for (auto& bk : s.buckets) bk.buffer.zero_();
}

const CommPtr& DistributedDataParallel::comm() const {
  return state_->comm;
}
const DDPOptions& DistributedDataParallel::options() const {
  return state_->opt;
}
const std::vector<BucketParam>& DistributedDataParallel::params() const {
  return state_->params;
}
const std::vector<Bucket>& DistributedDataParallel::buckets() const {
  return state_->buckets;
}

int64_t DistributedDataParallel::find_param(const Tensor& p) const {
  if (!p.defined()) return -1;
  auto it = state_->index.find(p.impl());
  return it == state_->index.end() ? -1 : static_cast<int64_t>(it->second);
}

int64_t DistributedDataParallel::num_collectives() const {
  return state_->collectives;
}
int64_t DistributedDataParallel::hooks_fired() const {
  return state_->hooks;
}
std::vector<int64_t> DistributedDataParallel::launch_hook_counts() const {
  return state_->launch_hooks;
}
double DistributedDataParallel::last_wait_seconds() const {
  return state_->wait_seconds;
}

}  // namespace td::distributed
