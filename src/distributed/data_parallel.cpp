#include "tardelli/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "distributed/worker.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {

// Note [ZeRO-2 gradient shards]: ZeRO-1 keeps every full bucket for the whole step and reduces
// once, on the last micro-batch. ZeRO-2 keeps only this rank's 1/dp shard of each bucket between
// reductions (grad_shard, fp32, persistent): every micro-batch reduce-scatters each bucket as soon
// as backward has produced it, and drain() adds the result into the shard and releases the full
// buffer (Note [Released storage]). A bucket's buffer comes back, zeroed, in the pre-accumulate
// hook of its first gradient after the last launch (on_grad_incoming), so the .grad views stay
// valid handles; the AccumulateGrad of the next micro-batch adds straight into it again. Each
// bucket runs its own cycle (pending count, launch, drain), and launches stay in bucket order,
// wrapping around to bucket 0 for the next micro-batch, so every rank issues the same sequence.
// A finished reduction is drained when the bucket's next gradient arrives, when another launch
// finds it completed (so buffers are freed while backward goes on) or in finish_grad_sync, and
// at most kMaxInFlight buckets wait on the network at once: the full gradient a rank holds is
// bounded by the buckets being accumulated plus those two, whatever the network's speed.
// Summing per-micro-batch averages equals averaging the accumulated sum up to fp32 rounding.

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
  std::vector<char> touched;    // ZeRO-2: a gradient arrived since the bucket's last launch
  std::deque<size_t> inflight;  // ZeRO-2: launched, not drained, oldest first
  static constexpr size_t kMaxInFlight = 2;
  size_t next_launch = 0;  // buckets launch strictly in order (Note [Bucket launch order])

  bool last_microbatch = true;
  bool synced = false;
  int64_t collectives = 0;
  int64_t hooks = 0;
  std::vector<int64_t> launch_hooks;
  double wait_seconds = 0;
  std::mutex mu;
  std::unique_ptr<Worker> worker;  // compressed buckets (Note [Compressed buckets])

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
    if (opt.shard_grads) {
      // The output is transient too: drain() adds it into the persistent shard and drops it.
      rs_out[b] = Tensor::empty({bk.shard_numel}, DType::Float32, bk.buffer.device());
      bk.buffer.storage().materialize();  // a bucket with no gradient since its last launch
      if (!touched[b]) bk.buffer.zero_();
    }
    if (opt.grad_scale != 1.0) {
      autograd::NoGradGuard no_grad;
      mul_(bk.buffer, opt.grad_scale);
    }
    if (opt.compressor) {
      // Note [Compressed buckets]: the compressor exchanges and decompresses on the DDP's worker
      // thread (buckets in launch order, so every rank issues the same collectives), while
      // backward goes on; the whole bucket then holds the mean, so under ZeRO-1 this rank's
      // shard of the buffer already is the averaged shard (finish_grad_sync copies no rs_out).
      // Only the worker touches the compressor until finish_grad_sync has waited.
      std::vector<CompressedParam> ps;
      for (size_t i : bk.params)
        ps.push_back({params[i].name, params[i].param.sizes(), params[i].offset, params[i].numel});
      Tensor used = bk.buffer.narrow(0, 0, bk.numel);
      if (!worker) worker = std::make_unique<Worker>();
      work[b] = std::make_shared<QueuedWork>(
          worker->submit([c = opt.compressor, b, used, ps = std::move(ps), cm = comm,
                          avg = opt.average]() mutable { c->reduce(b, used, ps, cm, avg); }));
      ++collectives;
      launch_hooks[b] = hooks;
      return;
    }
    if (opt.reduce_scatter) {
      work[b] = comm->reduce_scatter(rs_out[b], bk.buffer, op(), /*async_op=*/true);
    } else {
      work[b] = comm->all_reduce(bk.buffer, op(), /*async_op=*/true);
    }
    ++collectives;
    launch_hooks[b] = hooks;
    if (opt.shard_grads) {
      // Note [ZeRO-2 gradient shards]: each bucket runs its own cycle; the next micro-batch's
      // gradients for it start a new one (after drain()).
      touched[b] = 0;
      bucket_ready[b] = 0;
      pending[b] = static_cast<int64_t>(bk.params.size());
      for (size_t i : bk.params) param_ready[i] = 0;
      // Bounded memory: finished reductions are drained now, and at most kMaxInFlight full
      // buckets wait on the network (the oldest is waited for beyond that).
      inflight.push_back(b);
      for (size_t k = 0; k + 1 < inflight.size();) {
        const size_t o = inflight[k];
        if (work[o] && work[o]->is_completed()) {
          drain(o);
        } else {
          ++k;
        }
      }
      while (inflight.size() > kMaxInFlight) drain(inflight.front());
    }
  }

  // ZeRO-2: waits for bucket b's reduce-scatter, adds the result into its shard and releases
  // the full buffer (Note [ZeRO-2 gradient shards]).
  void drain(size_t b) {
    if (!work[b]) return;
    inflight.erase(std::find(inflight.begin(), inflight.end(), b));
    work[b]->wait();
    work[b].reset();
    Bucket& bk = buckets[b];
    autograd::NoGradGuard no_grad;
    add_(bk.grad_shard, rs_out[b]);
    rs_out[b] = Tensor();
    if (!touched[b]) bk.buffer.storage().release();
  }

  // ZeRO-2, before a gradient is accumulated into parameter i's view: its bucket's previous
  // reduction must be finished and its buffer present (zeroed).
  void on_grad_incoming(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    const size_t b = params[i].bucket;
    if (touched[b]) return;  // not the bucket's first gradient since its last launch
    touched[b] = 1;          // drain() must not release it now
    drain(b);
    Bucket& bk = buckets[b];
    bk.buffer.storage().materialize();
    autograd::NoGradGuard no_grad;
    bk.buffer.zero_();
  }

  // Note [Bucket launch order]: collectives must be issued in the same order on every rank.
  // Buckets usually become ready in order (reverse registration = backward order), but a rank
  // whose micro-batch leaves a parameter unused, or an engine order that differs, could make
  // bucket 2 ready before bucket 1. Launching only the ready prefix keeps the order fixed.
  void launch_ready_prefix() {
    if (opt.shard_grads) {
      // Cyclic: after the last bucket the next micro-batch starts again at bucket 0.
      while (bucket_ready[next_launch]) {
        launch(next_launch);
        next_launch = (next_launch + 1) % buckets.size();
      }
      return;
    }
    while (next_launch < buckets.size() && bucket_ready[next_launch]) launch(next_launch++);
  }

  void on_grad_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    synced = false;
    if (opt.shard_grads) {
      check_view(i);
      if (param_ready[i]) return;  // its bucket waits for a predecessor: accumulate only
      param_ready[i] = 1;
      ++hooks;
      const size_t b = params[i].bucket;
      if (--pending[b] == 0) bucket_ready[b] = 1;
      if (opt.overlap) launch_ready_prefix();
      return;
    }
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
  TD_CHECK(!options.compressor || !options.shard_grads,
           "DistributedDataParallel: gradient compression (",
           options.compressor ? options.compressor->name() : "",
           ") works with all_reduce and ZeRO-1 buckets, not "
           "with ZeRO-2/3 gradient shards");
  TD_CHECK(std::isfinite(options.grad_scale) && options.grad_scale > 0,
           "DistributedDataParallel: grad_scale must be finite and > 0, got ", options.grad_scale);
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
  TD_CHECK(!s.opt.shard_grads || s.opt.reduce_scatter,
           "DistributedDataParallel: shard_grads (ZeRO-2) needs reduce_scatter=true");
  std::vector<std::vector<size_t>> groups;
  if (!s.opt.buckets.empty()) {
    std::vector<char> seen(s.params.size(), 0);
    for (const auto& g : s.opt.buckets) {
      TD_CHECK(!g.empty(), "DistributedDataParallel: an explicit bucket is empty");
      for (size_t k : g) {
        TD_CHECK(k < s.params.size() && !seen[k],
                 "DistributedDataParallel: explicit buckets "
                 "must name each of the ",
                 s.params.size(), " parameters once; bad index ", k);
        seen[k] = 1;
      }
    }
    TD_CHECK(std::all_of(seen.begin(), seen.end(), [](char c) { return c != 0; }),
             "DistributedDataParallel: explicit buckets leave a parameter out");
    groups = s.opt.buckets;
  } else {
    groups.emplace_back();
    int64_t bytes = 0;
    const auto own = [&](size_t k) {
      return std::find(s.opt.own_bucket.begin(), s.opt.own_bucket.end(), s.params[k].name) !=
             s.opt.own_bucket.end();
    };
    for (size_t k = s.params.size(); k-- > 0;) {
      if (own(k)) {
        if (!groups.back().empty()) groups.emplace_back();
        groups.back().push_back(k);
        groups.emplace_back();
        bytes = 0;
        continue;
      }
      groups.back().push_back(k);
      bytes += s.params[k].numel * static_cast<int64_t>(sizeof(float));
      if (bytes >= s.opt.bucket_bytes && k > 0) {
        groups.emplace_back();
        bytes = 0;
      }
    }
    if (groups.back().empty()) groups.pop_back();
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
    if (s.opt.shard_grads) {
      bk.grad_shard = zeros({bk.shard_numel}, {DType::Float32, bk.buffer.device()});
      s.rs_out.emplace_back();
    } else if (s.opt.reduce_scatter) {
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
  s.touched.assign(nb, 0);
  if (s.opt.shard_grads) {
    for (size_t b = 0; b < nb; ++b) s.pending[b] = static_cast<int64_t>(s.buckets[b].params.size());
  }

  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const Tensor& p = s.params[i].param;
    Tensor view = s.grad_view(i);
    Tensor old = p.grad();
    if (old.defined()) copy_into(view, old);  // keep a gradient accumulated before wrapping
    p.set_grad(view);
    if (s.opt.shard_grads) {
      p.register_hook([weak, i](const Tensor&) -> std::optional<Tensor> {
        if (auto st = weak.lock()) st->on_grad_incoming(i);
        return std::nullopt;
      });
    }
    p.register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto st = weak.lock()) st->on_grad_ready(i);
    });
  }
  if (s.opt.shard_grads) {
    // ZeRO-2 keeps only the shards between reductions (a gradient accumulated before wrapping
    // is dropped, as zero_grad() would).
    for (auto& bk : s.buckets) bk.buffer.storage().release();
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
  if (s.opt.shard_grads) {
    // Buckets holding gradients not reduced yet (unused parameters, or overlap off) are
    // launched in the cyclic order; then everything is drained into the shards.
    const size_t nb = s.buckets.size();
    for (size_t k = 0; k < nb; ++k) {
      const size_t b = (s.next_launch + k) % nb;
      if (s.touched[b]) {
        for (size_t i : s.buckets[b].params) s.check_view(i);
        s.launch(b);
      }
    }
    s.next_launch = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (size_t b = 0; b < nb; ++b) s.drain(b);
    s.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.synced = true;
    return;
  }
  s.open_cycle();
  for (size_t i = 0; i < s.params.size(); ++i) s.check_view(i);
  // Buckets whose parameters did not all get a gradient (unused parameters) and, without
  // overlap, every bucket are launched here, in order.
  std::fill(s.bucket_ready.begin(), s.bucket_ready.end(), 1);
  s.launch_ready_prefix();
  s.wait_seconds = s.wait_all();
  if (s.opt.reduce_scatter && !s.opt.compressor) {
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
  autograd::NoGradGuard no_grad;
  if (s.opt.shard_grads) {
    for (size_t b = 0; b < s.buckets.size(); ++b) {
      s.touched[b] = 0;
      s.drain(b);
      Bucket& bk = s.buckets[b];
      bk.buffer.storage().release();
      bk.grad_shard.zero_();
      s.pending[b] = static_cast<int64_t>(bk.params.size());
      s.bucket_ready[b] = 0;
    }
    std::fill(s.param_ready.begin(), s.param_ready.end(), 0);
    s.next_launch = 0;
    s.synced = false;
    return;
  }
  s.wait_all();  // never zero a buffer a collective is still reading or writing
  std::fill(s.work.begin(), s.work.end(), nullptr);
  s.cycle_open = false;
  s.synced = false;
  for (auto& bk : s.buckets) bk.buffer.zero_();
}

Tensor DistributedDataParallel::shard_grad(size_t b) const {
  const State& s = *state_;
  TD_CHECK(b < s.buckets.size(), "DistributedDataParallel.shard_grad: bucket ", b,
           " out of range (", s.buckets.size(), " buckets)");
  TD_CHECK(s.opt.reduce_scatter, "DistributedDataParallel.shard_grad: only with reduce_scatter");
  const Bucket& bk = s.buckets[b];
  if (s.opt.shard_grads) return bk.grad_shard;
  return bk.buffer.narrow(0, s.comm->rank() * bk.shard_numel, bk.shard_numel);
}

int64_t DistributedDataParallel::grad_buffer_bytes() const {
  int64_t bytes = 0;
  for (const auto& bk : state_->buckets) {
    if (!bk.buffer.storage().released()) bytes += bk.buffer.numel() * 4;
    if (bk.grad_shard.defined()) bytes += bk.grad_shard.numel() * 4;
  }
  return bytes;
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
