// The pipeline-parallel runtime (Note [Pipeline runtime] in the header): the stage layout, the
// stages of one pp rank, and the executor of that rank's action list.
#include "tardelli/parallel/pipeline_runtime.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <utility>

#include "tardelli/autograd/engine.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/autograd/node.h"
#include "tardelli/autograd/weight_grad_store.h"
#include "tardelli/core/error.h"
#include "tardelli/ops/factory.h"

namespace td::parallel {

namespace dist = td::distributed;

namespace {

// "[1, 2]": a layout as the messages print it (as Python prints a list).
std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Seconds since the epoch on the system clock (Python's time.time()): the ranks of one machine
// read the same clock, so their timelines line up.
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What a message carries: a forward's output, a backward's input gradient, or an evaluation
// forward's output (forward_only).
enum Direction { kForward = 0, kBackward = 1, kForwardOnly = 2 };

// Unique per message of a step: (direction, micro-batch, receiving virtual stage).
int message_tag(int direction, int mb, int stage, int stages) {
  const int64_t tag = (static_cast<int64_t>(direction) * 1'000'003 + mb) * stages + stage;
  TD_CHECK(tag <= INT_MAX, "pipeline: message tag of micro-batch ", mb, " at virtual stage ", stage,
           " of ", stages, " overflows an int (too many micro-batches)");
  return static_cast<int>(tag);
}

// What a forward leaves for its backward: the stage's input (its .grad() is sent back) and the
// roots to backpropagate (the output, plus the stage's MoE loss terms).
struct Stashed {
  Tensor input;
  TensorList roots;
};

// Note [Sent tensors]: a send reads its tensor until it has completed, and nothing after: the
// runtime polls its sends before each action's compute (reap_sends: Work::is_completed, then
// wait(), which returns at once and rethrows a failure) and drops the completed ones; the rest
// are waited for at the step's end with the communicator's timeout, as before. (Megatron's p2p
// communication likewise drops a send's buffer when its request completes.)
// A forward's sent output is also a root of its backward, which reads only the root's shape
// (autograd::backward checks the incoming gradient against it) and its grad_fn, never its
// data: the data's one reader was the send. So once the send has completed the output's bytes
// go back to the allocator (Storage::release, Note [Released storage]), Megatron's
// deallocate_output_tensor. Only when the stashed root is the sole handle to its tensor and
// to its storage (autograd::is_sole_buffer): a node that saved the output, or a view of it,
// would hold another handle, and the bytes then stay (none does today: a stage ends with the
// residual add, whose backward saves nothing). Were a released output ever read, it would be
// a td::Error naming it, never stale data. Freed: up to one [t, d] per micro-batch a rank has
// sent forward and not yet backpropagated, and every input gradient it sent, which before
// were held to the step's end (wait_sends).
void release_sent_output(Stashed& st) {
  Tensor& out = st.roots[0];
  if (autograd::is_sole_buffer(out)) out.storage().release();
}

}  // namespace

std::vector<int64_t> stage_layout(int64_t n_layer, int pp, int vpp,
                                  const std::vector<int64_t>& layout) {
  TD_CHECK(pp >= 1 && vpp >= 1, "pipeline: pp (", pp, ") and vpp (", vpp, ") must be >= 1");
  const int64_t stages = static_cast<int64_t>(pp) * vpp;
  if (!layout.empty()) {
    const bool positive =
        std::all_of(layout.begin(), layout.end(), [](int64_t x) { return x >= 1; });
    const int64_t sum = std::accumulate(layout.begin(), layout.end(), int64_t{0});
    TD_CHECK(static_cast<int64_t>(layout.size()) == stages && positive && sum == n_layer,
             "pipeline: layout ", list_str(layout), " must give ", stages,
             " positive layer counts (pp ", pp, " x vpp ", vpp, ") summing to the ", n_layer,
             " layers");
    return layout;
  }
  TD_CHECK(n_layer % stages == 0, "pipeline: ", n_layer, " layers are not divisible into pp ", pp,
           " x vpp ", vpp, " = ", stages, " stages; pass an explicit layout for an uneven split");
  return std::vector<int64_t>(stages, n_layer / stages);
}

std::vector<std::shared_ptr<models::GPT>> build_pipeline_stages(
    const models::GPTConfig& config, int pp_rank, int pp, int vpp,
    const std::vector<int64_t>& layout) {
  const std::vector<int64_t> counts = stage_layout(config.n_layer, pp, vpp, layout);
  TD_CHECK(pp_rank >= 0 && pp_rank < pp, "pipeline: pp rank ", pp_rank, " is not in [0, ", pp, ")");
  std::vector<int64_t> starts(counts.size(), 0);
  std::exclusive_scan(counts.begin(), counts.end(), starts.begin(), int64_t{0});
  const int last = pp * vpp - 1;
  std::vector<std::shared_ptr<models::GPT>> chunks;
  for (int c = 0; c < vpp; ++c) {
    const int s = virtual_stage(pp_rank, c, pp);
    chunks.push_back(std::make_shared<models::GPT>(
        config, models::GPTStage{starts[s], counts[s], s == 0, s == last}));
  }
  return chunks;
}

PipelineRuntime::PipelineRuntime(std::vector<std::shared_ptr<models::GPT>> chunks,
                                 const dist::ProcessGrid& grid, ScheduleKind kind, int microbatches,
                                 int64_t micro_batch_size, int64_t seq_len)
    : chunks_(std::move(chunks)), pp_group_(grid.pp()), kind_(kind) {
  TD_CHECK(!chunks_.empty(), "pipeline: no model chunks given");
  for (const auto& c : chunks_) TD_CHECK(c != nullptr, "pipeline: a model chunk is null");
  pp_ = pp_group_->size();
  rank_ = pp_group_->rank();
  vpp_ = static_cast<int>(chunks_.size());
  stages_ = pp_ * vpp_;
  m_ = microbatches;
  TD_CHECK(kind == ScheduleKind::Interleaved || vpp_ == 1, "pipeline: schedule '", to_string(kind),
           "' runs one chunk per rank; --vpp ", vpp_, " needs the interleaved schedule");
  schedule_ = make_schedule(kind, pp_, m_, vpp_);
  validate(schedule_);
  for (int c = 0; c < vpp_; ++c) {
    const int s = virtual_stage(rank_, c, pp_);
    const models::GPTStage& st = chunks_[c]->stage();
    TD_CHECK(st.pre == (s == 0) && st.post == (s == stages_ - 1), "pipeline: chunk ", c,
             " of pp rank ", rank_, " is virtual stage ", s, " of ", stages_, " but holds",
             st.pre ? " the embeddings" : " no embeddings", " and",
             st.post ? " the head" : " no head", " (build the chunks with build_pipeline_stages)");
  }

  const models::GPT& first = *chunks_[0];
  const models::GPTConfig& cfg = first.config();
  const int64_t tp = first.parallelism() ? first.parallelism()->tp_size() : 1;
  const bool sp = first.parallelism() && first.parallelism()->sequence_parallel();
  act_shape_ = {micro_batch_size, seq_len / (sp ? tp : 1), cfg.d_model};
  act_dtype_ = cfg.dtype;
  // Received activations and gradients live where the chunks' parameters do (a GPU: the pp
  // group then stages them through host memory or moves them over NCCL).
  const TensorList params = first.parameters();
  act_device_ = params.empty() ? kCPU : params[0].device();

  if (cfg.arch == models::Arch::GPT2 && pp_ > 1) {
    const dist::CommPtr& w = grid.world();
    const bool on_end = rank_ == 0 || rank_ == pp_ - 1;
    const dist::GridCoords& co = grid.coords();
    const dist::ParallelDims& d = grid.dims();
    // One group per (tp, cp, dp) position: cp ranks hold different tokens' gradients, which
    // the dp x cp reduction sums, not this group.
    const int color = on_end ? co.tp + d.tp * (co.cp + d.cp * co.dp) : -1;
    embedding_group_ = w->split(color, w->rank(), "embedding" + std::to_string(std::max(color, 0)));
  }
}

Tensor PipelineRuntime::recv(int direction, int mb, int stage, int src) {
  Tensor t = empty(act_shape_, {act_dtype_, act_device_});
  pp_group_->recv(t, src, message_tag(direction, mb, stage, stages_), /*async_op=*/true)->wait();
  return t;
}

void PipelineRuntime::send(const Tensor& t, int direction, int mb, int stage, int dst,
                           std::pair<int, int> key) {
  Tensor c = t.contiguous();
  dist::WorkPtr work =
      pp_group_->send(c, dst, message_tag(direction, mb, stage, stages_), /*async_op=*/true);
  pending_.push_back({std::move(c), std::move(work), key});
}

std::vector<std::pair<int, int>> PipelineRuntime::reap_sends() {
  std::vector<std::pair<int, int>> outputs;
  auto done = std::stable_partition(pending_.begin(), pending_.end(),
                                    [](PendingSend& p) { return !p.work->is_completed(); });
  for (auto it = done; it != pending_.end(); ++it) {
    it->work->wait();  // completed: returns at once, or rethrows the send's failure
    if (it->key.first >= 0) outputs.push_back(it->key);
  }
  pending_.erase(done, pending_.end());
  return outputs;
}

void PipelineRuntime::wait_sends() {
  for (PendingSend& p : pending_) p.work->wait();
  pending_.clear();
}

double PipelineRuntime::step(const std::vector<MicroBatch>& batches, double loss_scale) {
  TD_CHECK(static_cast<int64_t>(batches.size()) == m_, "pipeline: ", batches.size(),
           " micro-batches given, the schedule has ", m_);
  pending_.clear();
  std::map<std::pair<int, int>, Stashed> stash;  // by (micro-batch, chunk)
  std::map<std::pair<int, int>, autograd::DeferredWeightGrads> deferred;
  std::vector<double> losses;
  const double t0 = wall_seconds();
  timeline_.clear();
  double busy = 0.0;
  // The seed of every backward: the loss scale over m, an fp32 scalar.
  const Tensor scale =
      scalar_tensor(loss_scale == 1.0 ? 1.0 / m_ : loss_scale / m_, DType::Float32, act_device_);
  for (const Action& a : schedule_.actions[rank_]) {
    const int mb = a.microbatch;
    const int s = virtual_stage(rank_, a.chunk, pp_);
    models::GPT& chunk = *chunks_[a.chunk];
    const std::pair<int, int> key{mb, a.chunk};
    // Receives happen before the action's clock starts: waiting for a neighbour is bubble, not
    // work (the timeline holds compute only). Completed sends are reaped after the receive,
    // before the compute allocates (Note [Sent tensors]).
    const auto reap = [&] {
      for (const auto& k : reap_sends()) {
        auto it = stash.find(k);
        if (it != stash.end()) release_sent_output(it->second);
      }
    };
    double a0 = 0.0;
    switch (a.kind) {
      case ActionKind::Forward: {
        Tensor input;
        if (s == 0) {
          input = batches[mb].input;
          TD_CHECK(input.defined(), "pipeline: micro-batch ", mb,
                   " has no input (the first stage embeds its token ids)");
        } else {
          input = recv(kForward, mb, s, holder(s - 1));
          input.set_requires_grad(true);
        }
        reap();
        const Tensor target = is_last(s) ? batches[mb].target : Tensor();
        TD_CHECK(!is_last(s) || target.defined(), "pipeline: micro-batch ", mb,
                 " has no target (the last stage computes the loss)");
        a0 = wall_seconds();
        Tensor out = chunk.forward_stage(input, target);
        TensorList roots;
        roots.reserve(2);  // the output, and a headless stage's MoE loss terms
        roots.push_back(out);
        if (is_last(s)) {
          losses.push_back(out.item_double());
        } else {
          send(out.detach(), kForward, mb, s + 1, holder(s + 1), key);
          // A stage's MoE loss terms are backpropagated with its output, seeded like the loss
          // (Note [MoE losses of a pipeline stage] in src/models/gpt.cpp).
          Tensor aux = chunk.take_moe_loss();
          if (aux.defined()) roots.push_back(aux);
        }
        stash[key] = Stashed{std::move(input), std::move(roots)};
        break;
      }
      case ActionKind::Backward:
      case ActionKind::BackwardInput: {
        auto it = stash.find(key);
        TD_CHECK(it != stash.end(), "pipeline: rank ", rank_, " runs ", to_string(a),
                 " before its forward");
        Stashed st = std::move(it->second);
        stash.erase(it);
        TensorList grads(st.roots.size(), scale);
        if (!is_last(s)) grads[0] = recv(kBackward, mb, s, holder(s + 1));
        reap();
        a0 = wall_seconds();
        if (a.kind == ActionKind::Backward) {
          autograd::backward(st.roots, grads, /*retain_graph=*/false, /*create_graph=*/false);
        } else {
          deferred[key] = autograd::backward_input(st.roots, grads);
        }
        if (s > 0) {
          const Tensor g = st.input.grad();
          TD_CHECK(g.defined(), "pipeline: ", to_string(a), " on rank ", rank_,
                   " left no gradient for the stage's input");
          send(g, kBackward, mb, s - 1, holder(s - 1));
        }
        break;
      }
      case ActionKind::BackwardWeight: {
        auto it = deferred.find(key);
        TD_CHECK(it != deferred.end(), "pipeline: rank ", rank_, " runs ", to_string(a),
                 " before its input-gradient backward");
        reap();
        a0 = wall_seconds();
        it->second.run();
        deferred.erase(it);
        break;
      }
    }
    const double a1 = wall_seconds();
    busy += a1 - a0;
    timeline_.push_back({a, a0, a1});
  }
  wait_sends();
  if (embedding_group_ && sync_tied_grads_) sync_tied_embedding();
  const double total = wall_seconds() - t0;
  last_stats_ = {total, busy, total > 0 ? 1.0 - busy / total : 0.0};
  return mean_over_pp(losses);
}

double PipelineRuntime::forward_only(const std::vector<MicroBatch>& batches) {
  pending_.clear();
  std::vector<double> losses;
  {
    autograd::NoGradGuard no_grad;
    for (size_t i = 0; i < batches.size(); ++i) {
      const int mb = static_cast<int>(i);
      for (int s = 0; s < stages_; ++s) {
        if (holder(s) != rank_) continue;
        models::GPT& chunk = *chunks_[chunk_of_stage(s, pp_)];
        const Tensor input = s == 0 ? batches[i].input : recv(kForwardOnly, mb, s, holder(s - 1));
        reap_sends();
        TD_CHECK(input.defined(), "pipeline: micro-batch ", mb,
                 " has no input (the first stage embeds its token ids)");
        const Tensor target = is_last(s) ? batches[i].target : Tensor();
        TD_CHECK(!is_last(s) || target.defined(), "pipeline: micro-batch ", mb,
                 " has no target (the last stage computes the loss)");
        Tensor out = chunk.forward_stage(input, target);
        if (is_last(s)) {
          losses.push_back(out.item_double());
        } else {
          send(out, kForwardOnly, mb, s + 1, holder(s + 1));
        }
      }
    }
  }
  wait_sends();
  return mean_over_pp(losses);
}

// Note [Pipeline loss]: the loss lives on the last stage's rank, which shares its mean with
// every pp rank. The mean is rounded exactly as the Python runtime did before this port (its
// trainer's losses stay bitwise the same): the fp32 per-micro-batch losses summed in double in
// order (CPython 3.11's sum()), divided by their count, rounded to fp32, all-reduced (sum) over
// pp as a one-element fp32 tensor (every other rank adds 0.0, exact) and returned as a double.
double PipelineRuntime::mean_over_pp(const std::vector<double>& losses) {
  double sum = 0.0;
  for (double l : losses) sum += l;
  const double mean = losses.empty() ? 0.0 : sum / static_cast<double>(losses.size());
  Tensor t = from_vector<float>({static_cast<float>(mean)}, {1});
  if (pp_ > 1) pp_group_->all_reduce(t, dist::ReduceOp::Sum);
  return t.item_double();
}

void PipelineRuntime::sync_tied_embedding() {
  for (const auto& ch : chunks_) {
    for (const auto& [name, p] : ch->named_parameters()) {
      if (name != "wte.weight") continue;
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor g = grad.contiguous();
      embedding_group_->all_reduce(g, dist::ReduceOp::Sum);
      if (!g.is_same(grad)) grad.copy_(g);
      return;
    }
  }
}

void PipelineRuntime::sync_tied_embedding_shard(dist::DistributedDataParallel& ddp) {
  if (!embedding_group_) return;
  const std::vector<dist::Bucket>& buckets = ddp.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::vector<size_t>& members = buckets[b].params;
    if (members.size() == 1 && ddp.params()[members[0]].name == "wte.weight") {
      Tensor shard = ddp.shard_grad(b);
      embedding_group_->all_reduce(shard, dist::ReduceOp::Sum);
      return;
    }
  }
  TD_ERROR(
      "pipeline: no gradient bucket holds wte.weight alone (give the DDP own_bucket "
      "{\"wte.weight\"} on the first and last stage)");
}

std::vector<std::vector<TimedAction>> PipelineRuntime::gather_timelines() {
  // Rows of (kind, micro-batch, chunk, start bits, end bits): the times cross as their int64
  // bit patterns, so every rank gets every other's doubles exactly.
  constexpr int64_t kCols = 5;
  Tensor sizes = zeros({pp_}, {DType::Int64});
  pp_group_->all_gather(sizes, from_vector<int64_t>({static_cast<int64_t>(timeline_.size())}, {1}));
  const std::vector<int64_t> counts = to_vector<int64_t>(sizes);
  const int64_t width = *std::max_element(counts.begin(), counts.end());
  std::vector<std::vector<TimedAction>> out(pp_);
  if (width == 0) return out;  // the same on every rank: nothing to gather
  std::vector<int64_t> rows(width * kCols, 0);
  for (size_t i = 0; i < timeline_.size(); ++i) {
    const TimedAction& t = timeline_[i];
    int64_t* row = rows.data() + i * kCols;
    row[0] = static_cast<int64_t>(t.action.kind);
    row[1] = t.action.microbatch;
    row[2] = t.action.chunk;
    std::memcpy(&row[3], &t.start, sizeof(double));
    std::memcpy(&row[4], &t.end, sizeof(double));
  }
  Tensor all = zeros({pp_ * width * kCols}, {DType::Int64});
  pp_group_->all_gather(all, from_vector<int64_t>(rows, {width * kCols}));
  const std::vector<int64_t> got = to_vector<int64_t>(all);
  for (int r = 0; r < pp_; ++r) {
    for (int64_t i = 0; i < counts[r]; ++i) {
      const int64_t* row = got.data() + (r * width + i) * kCols;
      TimedAction t;
      t.action = {static_cast<ActionKind>(row[0]), static_cast<int>(row[1]),
                  static_cast<int>(row[2])};
      std::memcpy(&t.start, &row[3], sizeof(double));
      std::memcpy(&t.end, &row[4], sizeof(double));
      out[r].push_back(t);
    }
  }
  return out;
}

}  // namespace td::parallel
