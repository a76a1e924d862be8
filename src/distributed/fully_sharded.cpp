#include "tardelli/distributed/fully_sharded.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/models/gpt.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {

// Note [FSDP parameter storage]: a parameter keeps its TensorImpl (the optimizer, the DDP's
// .grad view and the model all refer to it) and only its storage changes. A gather fills one
// flat fp32 buffer for the whole unit; each parameter's storage is then refilled with a
// non-owning pointer into that buffer whose deleter holds a reference to it, so the buffer is
// freed exactly when the last of the unit's parameters is released (Note [Released storage]).
// Tensors autograd saved in forward share those storages, so regathering before backward makes
// them valid again without touching the graph.
//
// Note [Compute-dtype gathers]: a unit whose gather dtype is bf16/f16 (the GPT's blocks and head
// when the model computes in that dtype) converts this rank's fp32 shard to the compute dtype and
// gathers that: half the traffic and half the working set. The fp32 parameters then never hold
// bytes; each has a compute-dtype copy (its own storage, filled like a parameter's) that the
// model takes through compute_param() instead of casting, and whose gradient flows back to the
// fp32 parameter cast to fp32, exactly as td::to_dtype's would: the weights the ops see are the
// same bf16 values as an unsharded model's cast. The embeddings read their fp32 tables directly,
// so those units gather in fp32.
struct FullyShardedDataParallel::State {
  enum class Status { Released, Gathering, Full };
  struct Unit {
    std::vector<size_t> params;  // indices into the DDP's params()
    int64_t bucket = -1;         // -1: empty unit
    int64_t chunk = 0;
    DType dtype = DType::Float32;  // gather dtype (Note [Compute-dtype gathers])
    std::vector<Tensor> compute;   // dtype != fp32: per parameter, its gathered copy
    Status status = Status::Released;
    Tensor flat;   // the gather's output while in flight
    WorkPtr work;  // the gather in flight
    int64_t pending_grads = 0;
    // Its gradients of the current backward are complete (set when on_grad_ready frees it,
    // cleared when a forward uses it again): a backward prefetch must not gather it again.
    bool backward_done = false;
  };

  CommPtr comm;
  FSDPOptions opt;
  std::vector<Unit> units;
  std::vector<Tensor> shards;                           // per DDP bucket
  std::vector<int64_t> unit_of;                         // per DDP param: its unit
  std::vector<size_t> slot_of;                          // per DDP param: its position in its unit
  std::unordered_map<const TensorImpl*, size_t> index;  // parameter -> DDP param index
  std::vector<char> got_grad;                           // per DDP param, in the current backward
  const DistributedDataParallel* ddp = nullptr;
  int64_t gathers = 0;
  int64_t bytes = 0, peak = 0;
  std::mutex mu;

  const BucketParam& param(size_t i) const { return ddp->params()[i]; }
  const Bucket& bucket(const Unit& u) const {
    return ddp->buckets()[static_cast<size_t>(u.bucket)];
  }

  void issue(int64_t k) {
    Unit& u = units[static_cast<size_t>(k)];
    if (u.bucket < 0 || u.status != Status::Released) return;
    const Bucket& bk = bucket(u);
    u.flat = Tensor::empty({bk.padded_numel}, u.dtype, bk.buffer.device());
    Tensor src = shards[static_cast<size_t>(u.bucket)];
    if (u.dtype != DType::Float32) {
      autograd::NoGradGuard no_grad;
      src = to_dtype(src, u.dtype);  // the Work keeps it alive until the gather is done
    }
    u.work = comm->all_gather(u.flat, src, /*async_op=*/true);
    u.status = Status::Gathering;
    ++gathers;
    bytes += unit_bytes(u);
    peak = std::max(peak, bytes);
  }

  // Note [FSDP parameter storage].
  void install(Unit& u) {
    u.work->wait();
    u.work.reset();
    char* base = static_cast<char*>(u.flat.data_ptr());
    const int64_t elem = static_cast<int64_t>(itemsize(u.dtype));
    for (size_t k = 0; k < u.params.size(); ++k) {
      const BucketParam& p = param(u.params[k]);
      DataPtr ptr(base + p.offset * elem, [keep = u.flat](void*) {});
      target(u, k).storage().refill(std::move(ptr));
    }
    u.flat = Tensor();
    u.status = Status::Full;
  }

  void ensure_full(int64_t k) {
    Unit& u = units[static_cast<size_t>(k)];
    if (u.bucket < 0 || u.status == Status::Full) return;
    issue(k);
    install(u);
  }

  void free_unit(int64_t k) {
    Unit& u = units[static_cast<size_t>(k)];
    if (u.bucket < 0 || u.status == Status::Released) return;
    if (u.status == Status::Gathering) install(u);  // a prefetch nobody used: complete it
    for (size_t k = 0; k < u.params.size(); ++k) target(u, k).storage().release();
    u.status = Status::Released;
    bytes -= unit_bytes(u);
  }

  int64_t unit_bytes(const Unit& u) const {
    return bucket(u).padded_numel * static_cast<int64_t>(itemsize(u.dtype));
  }

  // What a gather fills for the unit's k-th parameter: the parameter itself (fp32 units) or
  // its compute-dtype copy.
  const Tensor& target(const Unit& u, size_t k) const {
    return u.dtype == DType::Float32 ? param(u.params[k]).param : u.compute[k];
  }

  // The nearest non-empty unit from k in direction `step` inside k's chunk, or -1.
  int64_t neighbour(int64_t k, int64_t step) const {
    const int64_t chunk = units[static_cast<size_t>(k)].chunk;
    for (int64_t j = k + step; j >= 0 && j < static_cast<int64_t>(units.size()); j += step) {
      if (units[static_cast<size_t>(j)].chunk != chunk) return -1;
      if (units[static_cast<size_t>(j)].bucket >= 0) return j;
    }
    return -1;
  }

  bool later_unit_full(int64_t k) const {
    for (int64_t j = k + 1; j < static_cast<int64_t>(units.size()); ++j) {
      const Unit& u = units[static_cast<size_t>(j)];
      if (u.chunk != units[static_cast<size_t>(k)].chunk) break;
      if (u.bucket >= 0 && u.status == Status::Full) return true;
    }
    return false;
  }

  void check_unit(int64_t k, const char* op) const {
    TD_CHECK(k >= 0 && k < static_cast<int64_t>(units.size()), "FullyShardedDataParallel.", op,
             ": unit ", k, " out of range (", units.size(), " units, rank ", comm->rank(), ")");
  }

  // Backward: every parameter of a unit has its gradient, so nothing reads them any more.
  void on_grad_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (got_grad[i]) return;
    got_grad[i] = 1;
    Unit& u = units[static_cast<size_t>(unit_of[i])];
    if (--u.pending_grads > 0) return;
    u.pending_grads = static_cast<int64_t>(u.params.size());
    for (size_t j : u.params) got_grad[j] = 0;
    u.backward_done = true;
    free_unit(unit_of[i]);
  }

  // Note [Stale gathers]: once the optimizer has written new values into the shards, a unit
  // still gathered (a prefetch nobody used, the tied embedding held through backward) holds the
  // old ones, and a forward would use them. The optimizer calls this after every write.
  void shards_written() {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t k = 0; k < units.size(); ++k) free_unit(static_cast<int64_t>(k));
  }

  // Backward prefetch (Note [FSDP prefetch]) of the unit before k, unless its gradients are
  // already complete: the tied head on the last pipeline stage is unit 0 there, done before
  // the blocks' backward reaches it, and a gather then would only hold memory.
  void prefetch_before(int64_t k) {
    const int64_t prev = neighbour(k, -1);
    if (prev >= 0 && !units[static_cast<size_t>(prev)].backward_done) issue(prev);
  }
};

FullyShardedDataParallel::FullyShardedDataParallel(std::vector<nn::NamedTensors> units, CommPtr dp,
                                                   std::vector<int64_t> chunk_of,
                                                   FSDPOptions options,
                                                   std::vector<DType> gather_dtypes)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  TD_CHECK(dp != nullptr, "FullyShardedDataParallel: the data-parallel communicator is null");
  TD_CHECK(chunk_of.empty() || chunk_of.size() == units.size(),
           "FullyShardedDataParallel: ", chunk_of.size(), " chunk indices for ", units.size(),
           " units");
  TD_CHECK(gather_dtypes.empty() || gather_dtypes.size() == units.size(),
           "FullyShardedDataParallel: ", gather_dtypes.size(), " gather dtypes for ", units.size(),
           " units");
  s.comm = dp;
  s.opt = options;
  nn::NamedTensors flat;
  for (size_t k = 0; k < units.size(); ++k) {
    State::Unit u;
    u.chunk = chunk_of.empty() ? 0 : chunk_of[k];
    u.dtype = gather_dtypes.empty() ? DType::Float32 : gather_dtypes[k];
    for (const auto& [name, p] : units[k]) {
      TD_CHECK(p.defined() && p.dtype() == DType::Float32 && p.is_contiguous() &&
                   p.storage_offset() == 0 &&
                   p.storage().nbytes() == static_cast<size_t>(p.numel()) * 4,
               "FullyShardedDataParallel: parameter '", name,
               "' must be a contiguous float32 "
               "tensor owning its storage, got ",
               p.defined() ? describe(p) : "undefined");
      s.slot_of.push_back(u.params.size());
      s.index[p.impl()] = flat.size();
      u.params.push_back(flat.size());
      s.unit_of.push_back(static_cast<int64_t>(k));
      flat.emplace_back(name, p);
      if (u.dtype != DType::Float32) {
        Tensor c = Tensor::empty(p.sizes(), u.dtype, p.device());
        c.storage().release();
        u.compute.push_back(c);
      }
    }
    s.units.push_back(std::move(u));
  }
  // Buckets are the non-empty units in backward order (the reverse of forward order).
  DDPOptions ddp_opt;
  ddp_opt.reduce_scatter = true;
  ddp_opt.shard_grads = true;
  ddp_opt.average = options.average;
  for (size_t k = s.units.size(); k-- > 0;) {
    State::Unit& u = s.units[k];
    if (u.params.empty()) continue;
    u.bucket = static_cast<int64_t>(ddp_opt.buckets.size());
    ddp_opt.buckets.push_back(u.params);
  }
  TD_CHECK(!ddp_opt.buckets.empty(), "FullyShardedDataParallel: no parameters");
  ddp_ = std::make_unique<DistributedDataParallel>(flat, dp, ddp_opt);
  s.ddp = ddp_.get();
  s.got_grad.assign(flat.size(), 0);

  // This rank's shard of every unit, then the full parameters go away.
  autograd::NoGradGuard no_grad;
  const int64_t r = dp->rank();
  s.shards.resize(ddp_->buckets().size());
  for (auto& u : s.units) {
    if (u.bucket < 0) continue;
    const Bucket& bk = s.bucket(u);
    Tensor shard = zeros({bk.shard_numel}, {DType::Float32, bk.buffer.device()});
    const int64_t lo = r * bk.shard_numel, hi = lo + bk.shard_numel;
    for (size_t i : u.params) {
      const BucketParam& p = s.param(i);
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (a < e) {
        copy_into(shard.narrow(0, a - lo, e - a),
                  p.param.detach().reshape({-1}).narrow(0, a - p.offset, e - a));
      }
    }
    s.shards[static_cast<size_t>(u.bucket)] = shard;
    u.pending_grads = static_cast<int64_t>(u.params.size());
    for (size_t i : u.params) s.param(i).param.storage().release();
  }
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < flat.size(); ++i) {
    flat[i].second.register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto st = weak.lock()) st->on_grad_ready(i);
    });
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  try {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (auto& u : state_->units) {
      if (u.work) u.work->wait();
    }
  } catch (...) {
  }
}

std::shared_ptr<FullyShardedDataParallel> FullyShardedDataParallel::shard(
    const std::vector<std::shared_ptr<models::GPT>>& chunks, CommPtr dp, FSDPOptions options) {
  TD_CHECK(!chunks.empty(), "FullyShardedDataParallel.shard: no model chunks");
  std::vector<nn::NamedTensors> units;
  std::vector<int64_t> chunk_of, first;
  std::vector<DType> dtypes;
  for (size_t c = 0; c < chunks.size(); ++c) {
    first.push_back(static_cast<int64_t>(units.size()));
    auto mine = chunks[c]->param_units();
    for (size_t k = 0; k < mine.size(); ++k) {
      units.push_back(std::move(mine[k]));
      chunk_of.push_back(static_cast<int64_t>(c));
      // Note [Compute-dtype gathers]: units 0 and 1 are the embedding tables (read in fp32).
      const DType compute = chunks[c]->config().dtype;
      dtypes.push_back(options.compute_dtype_gathers && k >= 2 ? compute : DType::Float32);
    }
  }
  auto fsdp = std::make_shared<FullyShardedDataParallel>(
      std::move(units), std::move(dp), std::move(chunk_of), options, std::move(dtypes));
  for (size_t c = 0; c < chunks.size(); ++c) chunks[c]->set_param_units(fsdp, first[c]);
  return fsdp;
}

void FullyShardedDataParallel::materialize(int64_t unit) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.check_unit(unit, "materialize");
  // Note [FSDP prefetch]: not when a later unit is still full (the tied head reusing unit 0,
  // a recomputed block inside backward): the next unit would not be used next.
  const bool in_order = !s.later_unit_full(unit);
  s.units[static_cast<size_t>(unit)].backward_done = false;
  s.ensure_full(unit);
  if (s.opt.prefetch && in_order) {
    const int64_t next = s.neighbour(unit, +1);
    if (next >= 0) s.issue(next);
  }
}

Tensor FullyShardedDataParallel::release(const std::vector<int64_t>& units, const Tensor& y) {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (int64_t k : units) {
      s.check_unit(k, "release");
      s.free_unit(k);
    }
  }
  if (!autograd::needs_grad({y})) return y;
  Tensor out = y.detach();  // identity: shares y's storage
  std::weak_ptr<State> weak = state_;
  autograd::record("FSDPUnitBackward", {y}, {&out},
                   [weak, units, shape = y.sizes(), dt = y.dtype(), dev = y.device()](
                       const TensorList& g, const auto&) {
                     if (auto st = weak.lock()) {
                       std::lock_guard<std::mutex> lock(st->mu);
                       for (int64_t k : units) st->ensure_full(k);
                       if (st->opt.prefetch) st->prefetch_before(units.front());
                     }
                     return TensorList{g[0].defined() ? g[0] : zeros(shape, {dt, dev, false})};
                   });
  return out;
}

std::optional<Tensor> FullyShardedDataParallel::compute_param(const Tensor& p, DType dtype) {
  State& s = *state_;
  Tensor c;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.index.find(p.impl());
    if (it == s.index.end()) return std::nullopt;
    const int64_t k = s.unit_of[it->second];
    const State::Unit& u = s.units[static_cast<size_t>(k)];
    if (u.dtype == DType::Float32 || u.dtype != dtype) return std::nullopt;
    TD_CHECK(u.status == State::Status::Full, "FullyShardedDataParallel.compute_param: '",
             s.param(it->second).name, "' (unit ", k, ", rank ", s.comm->rank(),
             ") is used while its unit is not materialized");
    c = u.compute[s.slot_of[it->second]];
  }
  // Note [Compute-dtype gathers]: an alias of the gathered copy whose gradient goes to p.
  Tensor out = c.detach();
  if (autograd::needs_grad({p})) {
    autograd::record("FSDPComputeParamBackward", {p}, {&out},
                     [shape = p.sizes(), dev = p.device()](const TensorList& g, const auto&) {
                       autograd::NoGradGuard no_grad;
                       return TensorList{g[0].defined()
                                             ? to_dtype(g[0].detach(), DType::Float32)
                                             : zeros(shape, {DType::Float32, dev, false})};
                     });
  }
  return out;
}

void FullyShardedDataParallel::shards_written() {
  state_->shards_written();
}

ShardedOptimizerOptions FullyShardedDataParallel::optimizer_options(bool offload) {
  ShardedOptimizerOptions o;
  o.offload = offload;
  o.param_shards = state_->shards;
  o.param_shards_written = [weak = std::weak_ptr<State>(state_)] {
    if (auto st = weak.lock()) st->shards_written();
  };
  return o;
}

DistributedDataParallel& FullyShardedDataParallel::ddp() {
  return *ddp_;
}

const std::vector<Tensor>& FullyShardedDataParallel::param_shards() const {
  return state_->shards;
}

nn::NamedTensors FullyShardedDataParallel::full_parameters() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  autograd::NoGradGuard no_grad;
  nn::NamedTensors out;
  for (auto& u : s.units) {
    if (u.bucket < 0) continue;
    const Bucket& bk = s.bucket(u);
    Tensor flat = Tensor::empty({bk.padded_numel}, DType::Float32, bk.buffer.device());
    s.comm->all_gather(flat, s.shards[static_cast<size_t>(u.bucket)]);
    for (size_t i : u.params) {
      const BucketParam& p = s.param(i);
      out.emplace_back(p.name, flat.narrow(0, p.offset, p.numel).view(p.param.sizes()).clone());
    }
  }
  return out;
}

void FullyShardedDataParallel::load_full_parameters(const std::map<std::string, Tensor>& full) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  autograd::NoGradGuard no_grad;
  const int64_t r = s.comm->rank();
  for (auto& u : s.units) {
    if (u.bucket < 0) continue;
    const Bucket& bk = s.bucket(u);
    Tensor& shard = s.shards[static_cast<size_t>(u.bucket)];
    const int64_t lo = r * bk.shard_numel, hi = lo + bk.shard_numel;
    for (size_t i : u.params) {
      const BucketParam& p = s.param(i);
      auto it = full.find(p.name);
      TD_CHECK(it != full.end(), "FullyShardedDataParallel.load_full_parameters: no value for '",
               p.name, "'");
      TD_CHECK(it->second.sizes() == p.param.sizes(),
               "FullyShardedDataParallel.load_full_parameters: '", p.name, "' is ",
               describe(it->second), ", the parameter ", shape_str(p.param.sizes()));
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (a < e) {
        copy_into(shard.narrow(0, a - lo, e - a),
                  it->second.to(DType::Float32).reshape({-1}).narrow(0, a - p.offset, e - a));
      }
    }
    // A unit gathered right now would hold the old values: drop it (gathered again on use).
    s.free_unit(&u - s.units.data());
  }
}

int64_t FullyShardedDataParallel::gathered_bytes() const {
  return state_->bytes;
}
int64_t FullyShardedDataParallel::peak_gathered_bytes() const {
  return state_->peak;
}
void FullyShardedDataParallel::reset_peak_gathered_bytes() {
  state_->peak = state_->bytes;
}
int64_t FullyShardedDataParallel::num_gathers() const {
  return state_->gathers;
}

}  // namespace td::distributed
