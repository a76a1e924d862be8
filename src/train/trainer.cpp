// The training loop of td::train::Trainer (Note [C++ training loop] in trainer.h): layout,
// model, reduction, one step, evaluation, run(). python -m tardelli.train and tardelli-train
// both run it.
//
// Note [Exact resume]: everything a later step depends on is in the checkpoint: parameters,
// AdamW moments and step counts, the schedule's step, the data position (samples consumed: the
// dataset order is a pure function of the seed) and the dropout generators' Philox states. The
// ops are deterministic for a given thread count, so on the CPU in fp32 a resumed run repeats
// the uninterrupted run's losses bitwise (tests/python/test_train.py checks it).
//
// Note [Ranks on GPUs]: each rank trains on cuda:{local rank % devices}. With one rank per GPU
// its groups are NCCL communicators (one per process-grid group, created once by the grid's
// splits; point-to-point matched by tag: Note [NCCL point-to-point]); host tensors on them go
// over MPI. Ranks that share a GPU (NCCL refuses two ranks on one device; the lent test machine
// has one GPU) move CUDA tensors through host memory over MPI instead (distributed/
// host_staged.h). --gpu-comm auto finds out which from every rank's (host, device), gathered
// once; nccl insists and names the ranks that share a device.
//
// Note [Parallelize step]: the model (or this rank's pipeline chunks) is built from the seed
// with every parameter drawn from its own named stream, then each rank keeps its
// tensor-parallel shards: the same seed gives the same logical model for every layout.
//
// Note [Data parallel step]: gradients live in the DDP's buckets (the parameters' grads are
// views into them, never reset to undefined); a bucket's reduction starts as soon as backward
// has produced its last gradient, and only on the last micro-batch of a step (ZeRO-2: on every
// micro-batch, into persistent gradient shards). Context parallelism: replicated parameters see
// only this rank's tokens, so their gradients are averaged over dp x cp (Note [Context-parallel
// loss] in include/tardelli/parallel/context_parallel.h).
//
// Note [fp16 loss scaling]: fp16 activations need the loss scaled up before backward; the
// scaler (optim/loss_scaler.h, torch's GradScaler rules) skips a step whose gradients hold
// inf/nan on any rank: found from the total gradient norm, which every rank already agrees on
// (Note [Overflow from the norm]).
//
// Note [Non-finite steps]: every rank must take the same decision, or the replicas part (and
// the next collective may hang). The gradient norm is global: every rank already holds the
// same value (Note [fp16 loss scaling]). The loss is this rank's: its mean over ranks (reported
// in the row) would turn one rank's nan into nan everywhere (an IEEE sum), but only after the
// update and, under MoE, after the metrics' collectives; a flag reduced with an int max is
// exact and independent of how the backend sums floats, so the loss is agreed on explicitly,
// one all-reduce, only under --on-nonfinite skip (tests/python/test_train_faults.py checks
// that a nan on rank 1 only skips both ranks, and does reach rank 0's reported mean). Under
// --on-nonfinite raise a non-finite gradient norm stops the run before the update and a
// non-finite mean loss after it. Under fp16 a non-finite gradient is the loss scaler's (it
// skips and backs off); only a non-finite loss is ours.
//
// Note [Supervised metrics]: a restarted attempt appends to the metrics file instead of
// trimming it, after a restart event row, so the file holds every attempt's rows; the
// effective history is the last row of each step (python/tardelli/train/report.py's
// effective_rows).
//
// Note [Straggler report]: each step, every rank splits its step time into wait (seconds
// blocked in any of the job's communicators: gradient reductions, tp/cp/ep collectives,
// pipeline sends and receives, the non-finite agreement) and compute (the rest), and every
// rank gathers both (one all-gather over the world, after the timed step). In a synchronous
// job every rank's step takes as long as the slowest's, so a straggler shows as the rank whose
// compute is large while the others wait for it. The wait is not the DDP's
// last_wait_seconds(): that times only the final drain in finish_grad_sync, while with the
// communicators' consistency check (on by default) a bucket's launch during backward already
// blocks until every rank has reached it; the fast ranks' waiting would then count as compute
// (measured: 2 ranks, one sleeping 0.2 s a step, both "computed" 0.21 s). A rank whose compute
// exceeds --straggler-threshold x the median is logged, at most one step's report per
// --log-interval steps (the metrics file has every step's numbers).
//
// Note [Reduction bytes]: the row's dp_comm_bytes is what this rank handed to its
// gradient-reduction communicators in the step (their input bytes), cross_node_bytes the part
// of it the cross-node step of --hierarchical-reduce carried.
#include "tardelli/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <thread>

#include "py_format.h"
#include "tardelli/autograd/engine.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/checkpoint/training_state.h"
#include "tardelli/core/allocator.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/error.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/distributed/host_staged.h"
#include "tardelli/distributed/tag_matching.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/join.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/optim/lr_schedule.h"
#include "tardelli/parallel/expert_parallel.h"
#include "tardelli/parallel/parallelize.h"
#include "tardelli/train/metrics_file.h"
#include "tardelli/train/supervision.h"
#include "train_util.h"

namespace td::train {

namespace dist = td::distributed;
using detail::chunk_flops;
using detail::fmt;
using detail::logical_params;
using detail::now_s;
using detail::perf_s;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// --plan must be resolved before the loop is built (Note [No planner in C++]).
void check_supported(const TrainConfig& c) {
  if (!c.plan.empty()) {
    throw ConfigError("--plan " + c.plan +
                      ": the layout must be chosen before the training loop is built (the "
                      "planner is Python: python -m tardelli.train and tardelli-train resolve "
                      "it; a custom trainer runs python -m tardelli.plan and passes its flags)");
  }
}

// "cuda" becomes cuda:{local rank % visible devices} (python's td.distributed.device_for_rank).
std::string device_for_rank(const std::string& device) {
  if (device != "cuda") return device;
  const int n = cuda_device_count();
  TD_CHECK(n >= 1, "device_for_rank: no CUDA device is visible");
  int local = 0;
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') {
      local = std::atoi(v);
      break;
    }
  }
  return "cuda:" + std::to_string(local % n);
}

bool env_is_1(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

// Note [Ranks on GPUs]: the world for ranks on `device`, by --gpu-comm.
dist::CommPtr gpu_world(const dist::CommPtr& mpi, Device device, const std::string& how) {
  const auto shared = dist::ranks_sharing_a_device(mpi, device.index);
  if (how == "nccl" || (how == "auto" && !shared)) {
    if (shared) {
      throw ConfigError(td::detail::str_cat(
          "--gpu-comm nccl: ranks ", shared->first, " and ", shared->second,
          " share cuda:", device.index,
          " (NCCL needs one rank per GPU; --gpu-comm host-staged or auto moves their tensors "
          "through host memory instead)"));
    }
    return dist::nccl_communicator(mpi, device.index);
  }
  return dist::host_staged(mpi);
}

// Python's _mean_over_ranks: the mean over the world, in fp32 (one process: the value itself).
double mean_over_ranks(double v, const dist::CommPtr& world) {
  if (world == nullptr || world->size() == 1) return v;
  Tensor t = full({1}, v, {DType::Float32});
  world->all_reduce(t, dist::ReduceOp::Avg);
  return t.item<double>();
}

int64_t max_over_ranks(int64_t v, const dist::CommPtr& world) {
  if (world == nullptr || world->size() == 1) return v;
  Tensor t = full({1}, static_cast<double>(v), {DType::Int64});
  world->all_reduce(t, dist::ReduceOp::Max);
  return t.item<int64_t>();
}

double blocked_seconds(const std::vector<dist::CommPtr>& comms) {
  double s = 0;
  for (const auto& c : comms) s += c->stats().seconds;
  return s;
}

int64_t comm_bytes(const std::vector<dist::CommPtr>& comms) {
  int64_t n = 0;
  for (const auto& c : comms) n += c->stats().bytes;
  return n;
}

}  // namespace

Trainer::Trainer(TrainConfig cfg, dist::CommPtr world, std::optional<CheckpointOnly> only)
    : cfg_(std::move(cfg)), world_(std::move(world)), checkpoint_only_(std::move(only)) {
  check_supported(cfg_);
  const TrainConfig& c = cfg_;
  // ---- layout ----
  if ((c.zero > 0 || c.tp > 1 || c.pp > 1 || c.cp > 1 || c.ep > 1) && world_ == nullptr) {
    world_ = dist::mpi_world();  // a world of one
  }
  const int64_t size = world_ ? world_->size() : 1;
  const int64_t mp = c.tp * c.pp * c.cp;
  if (size % mp != 0) {
    throw ConfigError("--tp " + std::to_string(c.tp) + " x --cp " + std::to_string(c.cp) +
                      " x --pp " + std::to_string(c.pp) + " does not divide the " +
                      std::to_string(size) +
                      " ranks of this job (data-parallel size = ranks / (tp x cp x pp); start "
                      "the ranks with mpirun -np N or python -m tardelli.launch --nproc N)");
  }
  dp_size_ = size / mp;
  if (checkpoint_only_) {
    // The data need not be here: the layout is validated as for synthetic tokens.
    TrainConfig layout = cfg_;
    layout.synthetic_data = true;
    layout.data.clear();
    layout.vocab_size = checkpoint_only_->vocab_size;
    validate(layout, dp_size_);
  } else {
    validate(cfg_, dp_size_);
  }
  std::string device = c.device;
  if (world_ != nullptr && size > 1 && device != "cpu") {
    device = device_for_rank(device);  // Note [Ranks on GPUs]
    world_ = gpu_world(world_, Device::parse(device), c.gpu_comm);
  } else if (world_ != nullptr) {
    // Testing aids: CPU ranks take the staging, or the tag matching, of the GPU paths.
    if (env_is_1("TD_TEST_STAGE_HOST_TENSORS")) world_ = dist::host_staged(world_, true);
    if (env_is_1("TD_TEST_TAG_MATCHED_P2P")) world_ = dist::tag_matched_mpi(world_);
  }
  device_ = Device::parse(device);
  cfg_.device = device;
  if (world_ != nullptr) {
    dist::ParallelDims dims;
    dims.tp = static_cast<int>(c.tp);
    dims.cp = static_cast<int>(c.cp);
    dims.pp = static_cast<int>(c.pp);
    dims.dp = static_cast<int>(dp_size_);
    dims.ep = static_cast<int>(c.ep);
    // Expert parallelism: the experts' norm group (Note [Expert layout] in process_grid.h).
    std::vector<std::string> extra;
    if (c.ep > 1) extra.emplace_back("tp-ep-pp");
    if (precision_active(c)) extra.emplace_back("tp-cp-dp");  // Note [Amax reduction]
    grid_ = std::make_unique<dist::ProcessGrid>(world_, dims, extra);
  }
  accum_ = train::accumulation_steps(c, dp_size_);
  global_batch_ = c.micro_batch_size * dp_size_ * accum_;
  const int world_rank = world_ ? world_->rank() : 0;
  inject_grad_ = inject_steps(c);
  for (const auto& [step, rank] : inject_loss_steps(c)) {
    if (rank == -1 || rank == world_rank) inject_loss_.insert(step);
  }
  slow_s_ = slow_rank_seconds(world_rank);

  // ---- data ----
  DataOptions d;
  d.prefix = checkpoint_only_ ? std::string() : c.data;
  d.synthetic = checkpoint_only_ ? true : c.synthetic_data;
  d.vocab_size = checkpoint_only_ ? checkpoint_only_->vocab_size : c.vocab_size;
  d.seq_len = c.seq_len;
  d.seed = static_cast<uint64_t>(c.seed);
  d.split = split_ratios(c);
  d.micro_batch = c.micro_batch_size;
  d.dp_rank = grid_ ? grid_->coords().dp : 0;
  d.dp_size = dp_size_;
  // Every tp/cp/pp rank of a replica reads the same samples; a cp rank keeps its tokens.
  if (c.cp > 1) {
    d.cp_rank = grid_->coords().cp;
    d.cp_size = static_cast<int>(c.cp);
  }
  data_ = std::make_unique<TrainData>(d);

  // ---- model ----
  mcfg_.arch = models::parse_arch(c.arch);
  mcfg_.vocab_size = data_->vocab_size();
  mcfg_.block_size = c.seq_len;
  mcfg_.n_layer = c.layers;
  mcfg_.n_head = c.heads;
  mcfg_.n_kv_head = c.kv_heads;
  mcfg_.d_model = c.d_model;
  mcfg_.ffn_hidden = c.ffn_hidden;
  mcfg_.dropout = c.dropout;
  mcfg_.dtype = checkpoint::parse_short_dtype(c.dtype);
  mcfg_.seed = static_cast<uint64_t>(c.seed);
  mcfg_.num_experts = c.num_experts;
  mcfg_.moe_top_k = c.moe_top_k;
  mcfg_.moe_ffn_hidden = c.moe_ffn_hidden;
  mcfg_.moe_layer_freq = c.moe_layer_freq;
  mcfg_.moe_shared_experts = c.moe_shared_experts;
  mcfg_.moe_aux_loss_coeff = c.moe_aux_loss_coeff;
  mcfg_.moe_z_loss_coeff = c.moe_z_loss_coeff;
  mcfg_.moe_router_bias_update_rate = c.moe_router_bias_update_rate;
  mcfg_.moe_capacity_factor = c.moe_capacity_factor;
  // Note [Parallelize step]: every parameter is drawn from the seed, then each rank keeps its
  // tensor-parallel shards: the same logical model for every layout.
  if (c.pp > 1) {
    chunks_ = parallel::build_pipeline_stages(mcfg_, grid_->coords().pp, static_cast<int>(c.pp),
                                              static_cast<int>(c.vpp), pipeline_layout_counts(c));
  } else {
    chunks_ = {std::make_shared<models::GPT>(mcfg_)};
  }
  if (c.tp > 1 || c.cp > 1) {
    parallel::ParallelOptions po;
    po.sequence_parallel = c.sequence_parallel;
    po.make_vocab_size_divisible_by = c.make_vocab_size_divisible_by;
    po.cp_comm = c.cp_comm == "a2a" ? parallel::CPComm::AllToAll : parallel::CPComm::Ring;
    for (auto& ch : chunks_) parallel::apply_parallelism(*ch, grid_->tp(), grid_->cp(), po);
  }
  if (c.ep > 1) {
    // Each rank keeps num_experts / ep experts, routing tokens to the others' by all-to-all.
    for (auto& ch : chunks_) parallel::apply_expert_parallel(*ch, grid_->ep());
  }
  for (auto& ch : chunks_) {
    models::RecomputeOptions r;
    r.mode = models::parse_recompute(c.recompute);
    r.num_layers = c.recompute_layers > 0 ? c.recompute_layers : -1;
    ch->set_recompute(r);
    ch->train();
    if (!device_.is_cpu()) ch->to(device_);
  }
  // FP8 scalings and per-layer precision of the block linears (docs/fp8.md).
  precision_ = std::make_unique<BlockPrecision>(
      c, chunks_, grid_ != nullptr && precision_active(c) ? grid_->group("tp-cp-dp") : nullptr,
      c.pp > 1 ? grid_->pp() : nullptr);
  if (c.tp > 1 || c.pp > 1) mp_group_ = c.pp > 1 ? grid_->tp_pp() : grid_->tp();
  if (c.ep > 1) expert_group_ = grid_->group("tp-ep-pp");

  nn::NamedTensors named;
  std::vector<optim::ParamGroup> groups(2);
  for (auto& ch : chunks_) {
    for (auto& [n, p] : ch->named_parameters()) named.emplace_back(n, p);
    const std::vector<models::ParamGroup> pg = ch->param_groups(c.weight_decay);
    for (size_t i = 0; i < 2 && i < pg.size(); ++i) {
      for (const auto& [n, p] : pg[i].params) groups[i].params.push_back(p);
    }
  }
  for (size_t i = 0; i < 2; ++i) {
    groups[i].weight_decay = i == 0 ? c.weight_decay : 0.0;
    groups[i].lr = c.lr;
    groups[i].options = {{"beta1", c.beta1}, {"beta2", c.beta2}, {"eps", c.eps}};
  }
  optim::AdamWOptions defaults;
  defaults.lr = c.lr;
  defaults.beta1 = c.beta1;
  defaults.beta2 = c.beta2;
  defaults.eps = c.eps;
  build_reduction(named, groups, defaults);
  if (c.dtype == "fp16") {
    optim::LossScalerOptions so;
    so.init_scale = c.initial_loss_scale;
    so.growth_interval = c.loss_scale_window;
    scaler_ = std::make_unique<optim::DynamicLossScaler>(so);
  }
  if (c.pp > 1) {
    pipe_ = std::make_unique<parallel::PipelineRuntime>(
        chunks_, *grid_, parallel::parse_schedule_kind(c.schedule), static_cast<int>(accum_),
        c.micro_batch_size, c.seq_len / c.cp);
    pipe_->set_sync_tied_grads(c.zero < 2);
  }
  loader_ = data_->train_loader(restore());

  // ---- counts ----
  double flops = 0;
  for (const auto& ch : chunks_) {
    n_params_ += logical_params(*ch);
    flops += chunk_flops(*ch, global_batch_, c.seq_len);
  }
  if (c.pp > 1) {
    n_params_ =
        static_cast<int64_t>(dist::sum_over_ranks(static_cast<double>(n_params_), grid_->pp()));
    flops = dist::sum_over_ranks(flops, grid_->pp());
    if (mcfg_.arch == models::Arch::GPT2) n_params_ -= mcfg_.vocab_size * mcfg_.d_model;
  }
  flops_per_step_ = flops;
  // (A checkpoint-only run trains nothing: no MFU to measure for.)
  peak_ =
      checkpoint_only_ ? 1.0 : gemm_peak_flops(mcfg_.dtype, device_) * static_cast<double>(size);
  if (grid_ != nullptr) {
    comms_.push_back(grid_->world());
    for (const std::string& name : grid_->group_names()) {
      const dist::CommPtr& g = grid_->group(name);
      if (std::find(comms_.begin(), comms_.end(), g) == comms_.end()) comms_.push_back(g);
    }
  }
  for (const dist::CommPtr& g : reduce_comms_) {  // two-level reductions have their own
    if (std::find(comms_.begin(), comms_.end(), g) == comms_.end()) comms_.push_back(g);
  }
}

Trainer::~Trainer() = default;

double Trainer::lr_at(int64_t step) const {
  optim::LRScheduleConfig s;
  s.max_lr = cfg_.lr;
  s.min_lr = cfg_.min_lr_value();
  s.warmup_steps = cfg_.warmup_steps;
  s.decay_steps = cfg_.steps;
  s.style = optim::parse_decay_style(cfg_.lr_decay_style);
  return optim::lr_at(s, step);
}

std::vector<Tensor> Trainer::parameters() const {
  std::vector<Tensor> out;
  for (const auto& ch : chunks_) {
    for (const Tensor& p : ch->parameters()) out.push_back(p);
  }
  return out;
}

StepRecord Trainer::train_step() {
  const TrainConfig& c = cfg_;
  const double lr = lr_at(step_);
  if (zero_opt_ != nullptr) {
    for (auto& g : zero_opt_->param_groups()) g.lr = lr;
  } else {
    for (auto& g : adamw_->param_groups()) g.lr = lr;
  }
  if (expert_opt_ != nullptr) {
    for (auto& g : expert_opt_->param_groups()) g.lr = lr;
  }
  reset_peak_memory_stats(device_);
  const double t0 = perf_s(), blocked0 = blocked_seconds(comms_);
  const int64_t bytes0 = comm_bytes(reduce_comms_), cross0 = comm_bytes(cross_comms_);
  const std::vector<dist::DistributedDataParallel*> ddps = ddp_parts();
  for (dist::DistributedDataParallel* d : ddps) d->zero_grad();
  for (const auto& comp : compressors_) {  // Note [Compression warm-up] (grad_compression.h)
    comp->set_active(step_ >= c.compression_start_step);
  }
  const bool moe = mcfg_.num_experts > 0;
  if (moe) {
    for (auto& ch : chunks_) ch->reset_moe_stats();  // the step's statistics: all micro-batches
  }
  double loss_sum = 0;
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  // The factor backward is seeded with (x 1/accum): the loss scale, or inf on a step of
  // --inject-nonfinite-grad.
  const double backward_seed = loss_scale * (inject_grad_.count(step_ + 1) ? kInf : 1.0);
  if (slow_s_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slow_s_));
  if (pipe_ != nullptr) {
    std::vector<MicroBatch> batches;
    for (int64_t m = 0; m < accum_; ++m) {
      MicroBatch b = loader_->next();
      if (!device_.is_cpu()) b = {b.input.to(device_), b.target.to(device_)};
      batches.push_back(std::move(b));
    }
    // The schedule interleaves the micro-batches; the DDP reduction runs once after it.
    std::vector<bool> prev;
    for (dist::DistributedDataParallel* d : ddps) {
      prev.push_back(d->is_last_microbatch());
      d->set_last_microbatch(false);
    }
    auto restore = [&] {
      for (size_t i = 0; i < ddps.size(); ++i) ddps[i]->set_last_microbatch(prev[i]);
    };
    try {
      loss_sum = pipe_->step(batches, backward_seed) * static_cast<double>(accum_);
    } catch (...) {
      restore();
      throw;
    }
    restore();
  } else {
    for (int64_t m = 0; m < accum_; ++m) {
      MicroBatch b = loader_->next();
      if (!device_.is_cpu()) b = {b.input.to(device_), b.target.to(device_)};
      Tensor loss = chunks_[0]->forward(b.input, b.target);
      const Tensor scaled = accum_ == 1 && backward_seed == 1.0
                                ? loss
                                : mul(loss, backward_seed / static_cast<double>(accum_));
      for (dist::DistributedDataParallel* d : ddps) d->set_last_microbatch(m == accum_ - 1);
      autograd::backward({scaled}, {});
      loss_sum += loss.item<double>();
    }
    for (dist::DistributedDataParallel* d : ddps) d->set_last_microbatch(true);
  }
  // --inject-nonfinite-loss: the gradients stay finite.
  if (inject_loss_.count(step_ + 1)) loss_sum = std::numeric_limits<double>::quiet_NaN();
  for (dist::DistributedDataParallel* d : ddps) d->finish_grad_sync();
  if (ddp_ != nullptr && pipe_ != nullptr && c.zero >= 2) pipe_->sync_tied_embedding_shard(*ddp_);
  const double max_norm = c.clip_grad > 0 ? c.clip_grad : kInf;
  bool applied = true;
  double grad_norm = 0;
  if (scaler_ != nullptr) {
    // Note [fp16 loss scaling]: the norm of the scaled
    // gradients decides the overflow on every rank alike; one multiply unscales and clips.
    const double scaled_norm = grad_norm_clipped(kInf);
    applied = scaler_->update(!std::isfinite(scaled_norm));
    grad_norm = scaled_norm;
    if (applied) {
      const double factor = optim::unscale_clip_factor(scaled_norm, loss_scale, max_norm);
      grad_norm = scaled_norm / loss_scale;
      if (zero_opt_ != nullptr) {
        zero_opt_->scale_grads(factor);
        if (expert_opt_ != nullptr) expert_opt_->scale_grads(factor);
      } else {
        autograd::NoGradGuard no_grad;
        for (const Tensor& p : parameters()) {
          Tensor g = p.grad();
          if (g.defined()) mul_(g, factor);
        }
      }
    }
  } else {
    grad_norm = grad_norm_clipped(max_norm);
  }
  // Note [Non-finite steps]: every rank takes the same
  // decision: the gradient norm is global already, the loss is agreed on with an exact int max
  // over the world (only under --on-nonfinite skip). Under raise a non-finite gradient norm
  // stops the run before the update, a non-finite mean loss after it; under fp16 a non-finite
  // gradient is the loss scaler's.
  bool nonfinite = false;
  const bool grad_bad = scaler_ == nullptr && !std::isfinite(grad_norm);
  if (c.on_nonfinite == "skip") {
    const bool loss_bad = max_over_ranks(std::isfinite(loss_sum) ? 0 : 1, world_) != 0;
    nonfinite = grad_bad || loss_bad;
    skips_ += nonfinite ? 1 : 0;
    consecutive_ = nonfinite ? consecutive_ + 1 : 0;
  } else if (grad_bad) {
    throw Error("train: the gradient norm is " + py::str(grad_norm) + " at step " +
                std::to_string(step_ + 1) +
                " (diverged; lower --lr, use --clip-grad or --on-nonfinite skip)");
  }
  applied = applied && !nonfinite;
  if (applied) {
    if (zero_opt_ != nullptr) {
      zero_opt_->step();
      if (expert_opt_ != nullptr) expert_opt_->step();
    } else {
      adamw_->step();
    }
    if (moe && mcfg_.moe_router_bias_update_rate > 0) {
      for (auto& ch : chunks_) detail::update_moe_router_bias(*ch, dp_group());
    }
  }
  if (ddp_ == nullptr) adamw_->zero_grad(true);
  // Note [Amax reduction]: every rank commits the same amaxes and decisions.
  std::optional<json::Value> precision = precision_->step();
  if (device_.is_cuda()) cuda_synchronize(device_.index);
  const double dt = perf_s() - t0;
  const double wait = blocked_seconds(comms_) - blocked0;
  ++step_;

  StepRecord rec;
  rec.step = step_;
  rec.step_seconds = dt;
  rec.nonfinite = nonfinite;
  // The compute/wait split of every world rank (Note [Straggler report] in src/train/trainer.cpp).
  const double compute = std::max(dt - wait, 0.0);
  if (world_ == nullptr || world_->size() == 1) {
    rec.rank_compute_s = {compute};
    rec.rank_wait_s = {wait};
  } else {
    const int n = world_->size();
    Tensor out = zeros({2 * n}, {DType::Float32});
    const Tensor mine =
        from_vector<float>({static_cast<float>(compute), static_cast<float>(wait)}, {2});
    world_->all_gather(out, mine);
    const std::vector<float> flat = to_vector<float>(out);
    for (int r = 0; r < n; ++r) {
      rec.rank_compute_s.push_back(flat[2 * r]);
      rec.rank_wait_s.push_back(flat[2 * r + 1]);
    }
  }
  if (moe) {
    // `loss` stays the cross-entropy, comparable with a dense run's and with val_loss; the
    // auxiliary terms are reported apart (Note [MoE metrics] in src/train/train_moe.cpp).
    const detail::MoEStep m = detail::moe_step_metrics(chunks_, loss_sum, accum_, dp_group(),
                                                       c.pp > 1 ? grid_->pp() : nullptr);
    loss_sum = m.lm_loss * static_cast<double>(accum_);
    rec.moe = m.metrics;
  }
  rec.loss = mean_over_ranks(loss_sum / static_cast<double>(accum_), world_);
  rec.lr = lr;
  rec.grad_norm = grad_norm;
  rec.tokens_per_s = static_cast<double>(global_batch_ * c.seq_len) / dt;
  rec.time = now_s();
  rec.mfu = flops_per_step_ / dt / peak_;
  rec.mem_bytes = memory_stats(device_).peak_bytes;
  rec.peak_mem_bytes_max_rank = max_over_ranks(rec.mem_bytes, world_);
  // Note [Reduction bytes].
  if (!reduce_comms_.empty()) rec.dp_comm_bytes = comm_bytes(reduce_comms_) - bytes0;
  if (c.hierarchical_reduce && !reduce_comms_.empty()) {
    rec.cross_node_bytes = comm_bytes(cross_comms_) - cross0;
  }
  if (rec.moe) {
    rec.moe->aux_loss = mean_over_ranks(rec.moe->aux_loss, world_);
    rec.moe->z_loss = mean_over_ranks(rec.moe->z_loss, world_);
  }
  if (scaler_ != nullptr) rec.loss_scale = loss_scale;
  rec.precision = std::move(precision);
  if (scaler_ != nullptr || c.on_nonfinite == "skip") rec.skipped = !applied;
  if (c.on_nonfinite == "skip") rec.nonfinite_skips = skips_;
  if (!std::isfinite(rec.loss) && !nonfinite) {
    throw Error("train: the loss is " + py::str(rec.loss) + " at step " + std::to_string(step_) +
                " (diverged; lower --lr, use --clip-grad or --on-nonfinite skip)");
  }
  if (c.eval_interval > 0 && (step_ % c.eval_interval == 0 || step_ == c.steps)) {
    rec.val_loss = evaluate();
  }
  return rec;
}

std::optional<double> Trainer::evaluate() {
  std::unique_ptr<BatchSource> loader = data_->valid_loader();
  if (loader == nullptr || cfg_.eval_steps == 0) return std::nullopt;
  auto next = [&] {
    MicroBatch b = loader->next();
    if (!device_.is_cpu()) b = {b.input.to(device_), b.target.to(device_)};
    return b;
  };
  for (auto& ch : chunks_) ch->eval();
  double loss = 0;
  try {
    if (pipe_ != nullptr) {
      std::vector<MicroBatch> batches;
      for (int64_t i = 0; i < cfg_.eval_steps; ++i) batches.push_back(next());
      loss = pipe_->forward_only(batches);
    } else {
      autograd::NoGradGuard no_grad;
      double total = 0;
      for (int64_t i = 0; i < cfg_.eval_steps; ++i) {
        MicroBatch b = next();
        total += chunks_[0]->forward(b.input, b.target).item<double>();
      }
      loss = total / static_cast<double>(cfg_.eval_steps);
    }
  } catch (...) {
    for (auto& ch : chunks_) ch->train();
    throw;
  }
  for (auto& ch : chunks_) ch->train();
  return mean_over_ranks(loss, world_);
}

json::Value Trainer::run(const std::function<void(const std::string&)>& log,
                         const std::function<void(const StepRecord&)>& on_step) {
  const TrainConfig& c = cfg_;
  auto say = [&](const std::string& s) {
    if (is_main() && log) log(s);
  };
  {
    std::string layout = std::to_string(accum_) + " micro-batches of " +
                         std::to_string(c.micro_batch_size) + " x dp " + std::to_string(dp_size_);
    if (c.zero) layout += ", ZeRO-" + std::to_string(c.zero);
    if (c.offload_optimizer) layout += " + optimizer offload";
    if (c.tp > 1) layout += ", tp " + std::to_string(c.tp);
    if (c.sequence_parallel) layout += " + sequence parallel";
    if (c.cp > 1) layout += ", cp " + std::to_string(c.cp) + " (" + c.cp_comm + ")";
    if (c.pp > 1) {
      layout += ", pp " + std::to_string(c.pp) + " (" + c.schedule + ", vpp " +
                std::to_string(c.vpp) + ")";
    }
    if (c.ep > 1) layout += ", ep " + std::to_string(c.ep);
    say("train: " + c.arch + " " + std::to_string(c.layers) + " layers, d_model " +
        std::to_string(c.d_model) + ", " + std::to_string(c.heads) + " heads, vocab " +
        std::to_string(data_->vocab_size()) + ", " +
        fmt("%.2f", static_cast<double>(n_params_) / 1e6) + "M parameters, " + c.dtype +
        "; global batch " + std::to_string(global_batch_) + " x " + std::to_string(c.seq_len) +
        " tokens (" + layout + "); GEMM peak " + fmt("%.0f", peak_ / 1e9) + " GFLOP/s");
  }
  if (!fresh_start_note_.empty()) say(fresh_start_note_);
  if (resumed_) say(resumed_line());
  // Note [Supervised metrics]: a restarted attempt appends
  // after a restart event row, so the file holds every attempt's rows.
  const bool restarted = attempt_.value_or(0) > 0;
  MetricsFile metrics(is_main() ? c.metrics_file : "",
                      c.resume ? std::optional<int64_t>(step_) : std::nullopt, restarted);
  if (restarted) {
    json::Value event = json::Object{};
    event.set("event", "restart");
    event.set("attempt", *attempt_);
    event.set("step", step_);
    event.set("cause", restart_cause());
    metrics.write(event);
  }
  const int rank = world_ != nullptr ? world_->rank() : 0;
  heartbeat(rank, step_);  // built and resumed: the first step may start
  std::optional<StepRecord> last;
  std::optional<double> val_loss;
  double t_train = 0;
  int64_t peak_rank = 0, peak_max_rank = 0;
  const int64_t start_step = step_;
  double straggler_logged = -kInf;  // the last step that logged a straggler
  while (step_ < c.steps) {
    StepRecord rec = train_step();
    t_train += rec.step_seconds;
    peak_rank = std::max(peak_rank, rec.mem_bytes);
    peak_max_rank = std::max(peak_max_rank, rec.peak_mem_bytes_max_rank);
    if (rec.val_loss) val_loss = rec.val_loss;
    const bool give_up = rec.nonfinite && consecutive_ >= c.max_skipped_steps;
    const bool exiting = c.exit_interval > 0 && step_ % c.exit_interval == 0;
    save_if_due(rec, exiting, give_up, say);  // before the row, which carries save_blocked_s
    metrics.write(rec.to_json());
    if (on_step) on_step(rec);
    if (step_ % c.log_interval == 0 || step_ == c.steps || rec.val_loss) {
      say(format_log_line(rec, c.steps));
    }
    const auto slow = is_main() ? stragglers(rec.rank_compute_s, c.straggler_threshold)
                                : std::vector<std::pair<int, double>>{};
    if (!slow.empty() &&
        static_cast<double>(step_) - straggler_logged >= static_cast<double>(c.log_interval)) {
      straggler_logged = static_cast<double>(step_);  // at most once per --log-interval steps
      for (const auto& [r, ratio] : slow) say(straggler_line(r, rec.rank_compute_s[r], ratio));
    }
    if (give_up) {
      throw Error("train: step " + std::to_string(step_) + ": " + std::to_string(consecutive_) +
                  " consecutive steps (steps " + std::to_string(step_ - consecutive_ + 1) + "-" +
                  std::to_string(step_) +
                  ") skipped for a non-finite loss or gradient norm, the limit of "
                  "--max-skipped-steps " +
                  std::to_string(c.max_skipped_steps) +
                  " (diverged; lower --lr or use --clip-grad)");
    }
    last = rec;
    heartbeat(rank, step_);
    if (exiting) break;
  }
  finish_saves(say);
  heartbeat(rank, step_, true);
  json::Value s = json::Object{};
  s.set("event", "train_end");
  s.set("step", step_);
  s.set("params", n_params_);
  s.set("dp", dp_size_);
  s.set("tp", c.tp);
  s.set("pp", c.pp);
  s.set("cp", c.cp);
  s.set("ep", c.ep);
  int64_t local = 0;
  for (const auto& ch : chunks_) local += ch->num_parameters();
  s.set("local_params", local);
  s.set("device", cfg_.device);
  s.set("comm_backend", world_ ? json::Value(world_->backend()) : json::Value());
  s.set("tokens_per_s", static_cast<double>((step_ - start_step) * global_batch_ * c.seq_len) /
                            std::max(t_train, 1e-9));
  if (last) {
    s.set("loss", last->loss);
    s.set("mfu", flops_per_step_ * static_cast<double>(step_ - start_step) /
                     std::max(t_train, 1e-9) / peak_);
    s.set("peak_mem_bytes", peak_rank);
    s.set("peak_mem_bytes_max_rank", peak_max_rank);
    s.set("mem_current_bytes", memory_stats(device_).current_bytes);
    if (c.zero) {
      int64_t state = zero_opt_->optimizer_state_bytes(), host = zero_opt_->host_state_bytes();
      if (expert_opt_ != nullptr) {
        state += expert_opt_->optimizer_state_bytes();
        host += expert_opt_->host_state_bytes();
      }
      int64_t buffers = 0;
      for (const dist::DistributedDataParallel* d : ddp_parts()) {
        buffers += d->grad_buffer_bytes();
      }
      s.set("zero", c.zero);
      s.set("optimizer_state_bytes", state);
      s.set("host_state_bytes", host);
      s.set("grad_buffer_bytes", buffers);
    }
  }
  if (mcfg_.num_experts > 0) {
    s.set("num_experts", mcfg_.num_experts);
    int64_t layers = 0;
    for (const auto& ch : chunks_) layers += static_cast<int64_t>(ch->moe_router_load().size());
    if (c.pp > 1) {
      layers = static_cast<int64_t>(dist::sum_over_ranks(static_cast<double>(layers), grid_->pp()));
    }
    s.set("moe_layers", layers);
    s.set("moe_bias_replicated", detail::moe_bias_replicated(chunks_, dp_group()));
  }
  if (c.on_nonfinite == "skip") s.set("nonfinite_skips", skips_);
  if (precision_->report()) {
    s.set("precision", precision_->summary_counts());
    s.set("precision_replicated", precision_->replicated(world_));
  }
  if (scaler_ != nullptr) {
    s.set("loss_scale", scaler_->scale());
    s.set("skipped_steps", scaler_->state().skipped_steps);
  }
  if (val_loss) s.set("val_loss", *val_loss);
  if (pipe_ != nullptr && last) {
    timelines_ = pipe_->gather_timelines();
    const auto& timelines = timelines_;
    double t_first = kInf, t_last = -kInf, busy = 0;
    for (const auto& rank : timelines) {
      for (const auto& a : rank) {
        t_first = std::min(t_first, a.start);
        t_last = std::max(t_last, a.end);
        busy += a.end - a.start;
      }
    }
    const double span = t_last - t_first;
    s.set("schedule", c.schedule);
    s.set("microbatches", accum_);
    s.set("bubble_fraction",
          span > 0 ? 1.0 - busy / (static_cast<double>(timelines.size()) * span) : 0.0);
    s.set("bubble_formula", parallel::bubble_formula(
                                parallel::parse_schedule_kind(c.schedule), static_cast<int>(c.pp),
                                static_cast<int>(accum_), static_cast<int>(c.vpp)));
    Tensor peaks = zeros({c.pp}, {DType::Int64});
    grid_->pp()->all_gather(peaks, full({1}, static_cast<double>(last->mem_bytes), {DType::Int64}));
    json::Array arr;
    for (int64_t v : to_vector<int64_t>(peaks)) arr.emplace_back(v);
    s.set("stage_peak_mem_bytes", std::move(arr));
    if (is_main() && !c.trace.empty()) {
      write_text_file(c.trace, json::dump(parallel::chrome_trace(timelines)));
      s.set("trace", c.trace);
    }
  }
  return s;
}

}  // namespace td::train
