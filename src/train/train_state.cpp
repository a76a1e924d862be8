#include "tardelli/train/train_state.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <unordered_map>

#include "py_format.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/checkpoint/checkpoint.h"
#include "tardelli/checkpoint/sharded_state.h"
#include "tardelli/checkpoint/training_state.h"
#include "tardelli/core/error.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"
#include "tardelli/train/metrics_file.h"

namespace td::train {

namespace ck = td::checkpoint;
namespace dist = td::distributed;
namespace fs = std::filesystem;

namespace {

constexpr std::array<const char*, 2> kMoments = {"exp_avg", "exp_avg_sq"};

std::string comm_file(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "compression.rank%05d.safetensors", rank);
  return buf;
}

std::string rng_file(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rng.rank%05d.json", rank);
  return buf;
}

// os.path.join(root, name).
std::string join_path(const std::string& root, const std::string& name) {
  if (root.empty() || root.back() == '/') return root + name;
  return root + "/" + name;
}

bool is_expert_parameter(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

Tensor narrow_box(Tensor t, const ck::Box& box) {
  for (size_t d = 0; d < box.offsets.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
  }
  return t;
}

// Python's ==: numbers by value (1 == 1.0), objects whatever their member order.
bool py_equal(const json::Value& a, const json::Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.is_object() && b.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.as_object()) {
      const json::Value* o = b.find(k);
      if (o == nullptr || !py_equal(v, *o)) return false;
    }
    return true;
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!py_equal(a.as_array()[i], b.as_array()[i])) return false;
    }
    return true;
  }
  return a == b;
}

json::Value stage_json(const models::GPT& ch) {
  const models::GPTStage& st = ch.stage();
  return json::Array{st.first_layer, st.num_layers, st.pre, st.post};
}

// Where this rank's copy of parameter `name` of `ch` lies in the global tensor: the
// global shape, the local shape, the (local box, global box) pairs, and whether
// this rank saves it among its tensor-parallel replicas (gpt2's tied table on a stage without
// the embeddings is a copy of the first stage's: never).
struct Place {
  Shape shape, local;
  std::vector<ck::BoxMap> map;
  bool owner = false;

  Place(const models::GPT& ch, const std::string& name) {
    const nn::ShardSpec spec = ch.shard_spec(name);
    shape = ch.full_shape(name);
    Shape base = shape;
    int64_t shift = 0;
    if (is_expert_parameter(name) && ch.ep_size() > 1) {
      base[0] = shape[0] / ch.ep_size();  // this rank's slice of the stacked experts
      shift = ch.ep_rank() * base[0];
    }
    map = ck::shard_placement(spec, base);
    if (shift != 0) map = ck::shift_placement(std::move(map), 0, shift);
    const bool split = spec.dim >= 0 && spec.parts > 1;
    local = base;
    if (split) {
      int64_t total = 0;
      for (int64_t s : spec.segments) total += s;
      local[spec.dim] = total / spec.parts;
    }
    const int tp_rank = ch.parallelism() != nullptr ? ch.parallelism()->tp_rank() : 0;
    owner = (split || tp_rank == 0) && !(name == "wte.weight" && !ch.stage().pre);
  }

  void pieces(const std::string& name, const Tensor& t, std::vector<ck::GlobalPiece>& out) const {
    for (const ck::BoxMap& m : map) {
      out.push_back({name, shape, m.global, narrow_box(t, m.local).contiguous()});
    }
  }

  // The pieces of flat elements [begin, end) of the local tensor, given as `flat`.
  void flat_pieces(const std::string& name, const Tensor& flat, int64_t begin, int64_t end,
                   std::vector<ck::GlobalPiece>& out) const {
    Tensor buf = zeros(local);
    buf.reshape({-1}).narrow(0, begin, end - begin).copy_(flat.reshape({-1}));
    for (const ck::Box& fb : ck::flat_range_boxes(local, begin, end)) {
      for (const ck::BoxMap& m : ck::map_local_box(map, fb)) {
        out.push_back({name, shape, m.global, narrow_box(buf, m.local).contiguous()});
      }
    }
  }

  // The local tensor of global tensor `name` (zeros where the shard is padding).
  Tensor read(const ck::PieceIndex& index, const std::string& name) const {
    Tensor out = zeros(local);
    for (const ck::BoxMap& m : map) narrow_box(out, m.local).copy_(index.read(name, m.global));
    return out;
  }

  Tensor read_flat(const ck::PieceIndex& index, const std::string& name, int64_t begin,
                   int64_t end) const {
    Tensor out = zeros(local);
    for (const ck::Box& fb : ck::flat_range_boxes(local, begin, end)) {
      for (const ck::BoxMap& m : ck::map_local_box(map, fb)) {
        narrow_box(out, m.local).copy_(index.read(name, m.global));
      }
    }
    return out.reshape({-1}).narrow(0, begin, end - begin).clone();
  }
};

std::map<std::string, Place> places_of(const TrainState& s) {
  std::map<std::string, Place> out;
  for (const auto& ch : s.chunks) {
    for (const auto& [n, t] : ch->named_parameters()) out.emplace(n, Place(*ch, n));
  }
  return out;
}

// Whether this rank saves the replicated copies of `name` it holds: the first dp and cp rank
// (an expert's: the first expert-data-parallel rank).
bool saves_replicas(const TrainState& s, const std::string& name) {
  if (s.grid == nullptr) return true;
  const dist::GridCoords& c = s.grid->coords();
  const bool expert = is_expert_parameter(name) && s.grid->dims().ep > 1;
  return c.cp == 0 && (expert ? c.edp == 0 : c.dp == 0);
}

// A DistributedOptimizer state key "<param>.<kind>[a:b]" (Note [ZeRO-1 state names]).
struct ZeroKey {
  std::string param, kind;
  int64_t begin = 0, end = 0;
};

std::optional<ZeroKey> parse_zero_key(const std::string& key) {
  const size_t open = key.rfind('[');
  if (open == std::string::npos || key.back() != ']') return std::nullopt;
  const size_t colon = key.find(':', open);
  const size_t dot = key.rfind('.', open);
  if (colon == std::string::npos || dot == std::string::npos) return std::nullopt;
  ZeroKey k{key.substr(0, dot), key.substr(dot + 1, open - dot - 1)};
  if (k.kind != "master" && k.kind != "exp_avg" && k.kind != "exp_avg_sq") return std::nullopt;
  const auto b = py::parse_int(key.substr(open + 1, colon - open - 1));
  const auto e = py::parse_int(key.substr(colon + 1, key.size() - colon - 2));
  if (!b || !e) return std::nullopt;
  k.begin = *b;
  k.end = *e;
  return k;
}

std::unordered_map<const TensorImpl*, std::string> names_by_identity(const TrainState& s) {
  std::unordered_map<const TensorImpl*, std::string> m;
  for (const auto& ch : s.chunks) {
    for (const auto& [n, p] : ch->named_parameters()) m.emplace(p.impl(), n);
  }
  return m;
}

// This rank's pieces (Note [Layout-free checkpoints] in train_state.h), in this order:
// parameters, buffers, then the moments (ZeRO: in named_state's key order; AdamW: by packed
// index, which is the order Python's AdamW first gives parameters their state).
std::vector<ck::GlobalPiece> rank_pieces(const TrainState& s) {
  const auto places = places_of(s);
  std::vector<ck::GlobalPiece> pieces;
  // ZeRO-3: the gathered parameters (a collective over dp), in the units' order.
  nn::NamedTensors values;
  if (s.fsdp != nullptr) {
    values = s.fsdp->full_parameters();
  } else {
    for (const auto& ch : s.chunks) {
      for (const auto& [n, t] : ch->named_parameters()) values.emplace_back(n, t);
    }
  }
  for (const auto& [n, t] : values) {
    const Place& pl = places.at(n);
    if (pl.owner && saves_replicas(s, n)) pl.pieces(n, t, pieces);
  }
  for (const auto& ch : s.chunks) {
    for (const auto& [n, b] : ch->named_buffers()) {
      if (saves_replicas(s, n) && (s.grid == nullptr || s.grid->coords().tp == 0)) {
        pieces.push_back({n, b.sizes(), ck::Box::whole(b.sizes()), b.contiguous()});
      }
    }
  }
  if (s.zero != nullptr) {
    for (auto* opt : {s.zero, s.expert_zero}) {
      if (opt == nullptr) continue;
      for (const auto& [key, v] : opt->named_state()) {
        const auto k = parse_zero_key(key);
        if (!k || k->kind == "master") continue;  // the masters are the parameters
        const Place& pl = places.at(k->param);
        if (pl.owner) pl.flat_pieces(k->param + "." + k->kind, v, k->begin, k->end, pieces);
      }
    }
  } else {
    const auto names = names_by_identity(s);
    const optim::OptimizerState sd = s.adamw->state_dict();
    std::vector<Tensor> packed;
    for (const auto& g : s.adamw->param_groups()) {
      for (const Tensor& p : g.params) packed.push_back(p);
    }
    for (const auto& [i, st] : sd.state) {
      if (st.tensors.empty()) continue;
      const std::string& n = names.at(packed[static_cast<size_t>(i)].impl());
      const Place& pl = places.at(n);
      if (!pl.owner || !saves_replicas(s, n)) continue;
      for (const char* kind : kMoments) pl.pieces(n + "." + kind, st.tensors.at(kind), pieces);
    }
  }
  return pieces;
}

int64_t optimizer_step(const TrainState& s) {
  if (s.zero != nullptr) return s.zero->step_count();
  int64_t step = 0;
  for (const auto& [i, st] : s.adamw->state_dict().state) step = std::max(step, st.step);
  return step;
}

// This rank's rng.rankNNNNN.json: each chunk's dropout streams and block linears' state (names,
// FP8 scalings, precision policy), as Python's json.dumps writes it (format 2's text).
std::string rng_text(const TrainState& s) {
  json::Array chunks;
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const auto& ch = s.chunks[i];
    json::Value c = json::Object{};
    c.set("stage", stage_json(*ch));
    c.set("dropout", ck::generator_to_json(ch->dropout_generator()));
    c.set("split_rng", ch->parallelism() != nullptr
                           ? ck::generator_to_json(ch->parallelism()->split_generator())
                           : json::Value());
    if (s.precision != nullptr) {
      const json::Value state = s.precision->chunk_state(i);
      for (const auto& [k, v] : state.as_object()) c.set(k, v);
    } else {
      json::Array linears;
      for (const std::string& n : ch->linear_names()) linears.emplace_back(n);
      c.set("linears", std::move(linears));
    }
    chunks.push_back(std::move(c));
  }
  return python_json(json::Object{{"chunks", std::move(chunks)}});
}

json::Value meta_json(const TrainState& s, int64_t step, int64_t consumed_samples,
                      const std::optional<NonfiniteCounters>& nonfinite) {
  const TrainConfig& c = *s.cfg;
  json::Value m = json::Object{};
  m.set("step", step);
  m.set("state_format", kStateFormat);
  m.set("config", ck::config_to_json(s.model_config));
  m.set("scheduler", json::Object{{"max_lr", c.lr},
                                  {"min_lr", c.min_lr_value()},
                                  {"warmup_steps", c.warmup_steps},
                                  {"decay_steps", c.steps},
                                  {"style", c.lr_decay_style},
                                  {"last_step", step}});
  m.set("data", json::Object{{"consumed_samples", consumed_samples},
                             {"seed", c.seed},
                             {"prefix", c.data},
                             {"synthetic", c.synthetic_data}});
  m.set("rng",
        json::Object{{"dropout", ck::generator_to_json(s.chunks.front()->dropout_generator())}});
  m.set("optimizer", json::Object{{"name", "AdamW"}, {"step", optimizer_step(s)}});
  m.set("parallel", layout_json(s));
  m.set("train", to_json(c));
  if (s.scaler != nullptr) {
    const optim::LossScalerState& st = s.scaler->state();
    m.set("loss_scaler", json::Object{{"scale", st.scale},
                                      {"growth_tracker", st.growth_tracker},
                                      {"skipped_steps", st.skipped_steps}});
  }
  if (nonfinite) {
    m.set("nonfinite",
          json::Object{{"skips", nonfinite->skips}, {"consecutive", nonfinite->consecutive}});
  }
  return m;
}

}  // namespace

json::Value layout_json(const TrainState& s) {
  const TrainConfig& c = *s.cfg;
  const models::GPT& first = *s.chunks.front();
  const int64_t size = s.world != nullptr ? s.world->size() : 1;
  const int64_t tp = first.parallelism() != nullptr ? first.parallelism()->tp_size() : 1;
  const bool sp = first.parallelism() != nullptr && first.parallelism()->sequence_parallel();
  return json::Object{{"dp", size / (tp * c.pp * c.cp)},
                      {"cp", c.cp},
                      {"tp", tp},
                      {"pp", c.pp},
                      {"vpp", c.vpp},
                      {"ep", first.ep_size()},
                      {"pipeline_layout", c.pipeline_layout},
                      {"world", size},
                      {"zero", c.zero},
                      {"sequence_parallel", sp}};
}

// ---- saving ----

// One checkpoint save of this rank: prepared on the training thread (the
// pieces, the metadata, the writer), written (possibly on another thread), committed by rank 0.
struct SaveJob {
  int rank = 0, size = 1;
  std::string root, name, path;
  std::vector<ck::GlobalPiece> pieces;
  std::vector<Device> devices;  // the GPUs whose snapshot copies write() waits for
  std::string rng, tokenizer_dir;
  ck::NamedTensors comm_state;  // the compressors' error feedback, "<i>/<name>"
  json::Value meta;
  std::unique_ptr<ck::CheckpointWriter> writer;

  SaveJob(const TrainState& s, const std::string& root_dir, int64_t step, int64_t consumed,
          const std::optional<NonfiniteCounters>& nonfinite, bool snapshot)
      : root(root_dir), name(ck::step_dir_name(step)), path(join_path(root_dir, name)) {
    if (s.world != nullptr) {
      rank = s.world->rank();
      size = s.world->size();
    }
    pieces = rank_pieces(s);
    if (snapshot) {
      // Note [Async save]: host copies of every piece, taken now (the step's tensors change as
      // soon as this returns); a GPU tensor's is filled on the snapshot stream, waited for in
      // write() (Note [Host snapshot] in core/cuda_runtime.h).
      for (ck::GlobalPiece& p : pieces) {
        const Device d = p.data.device();
        if (!d.is_cpu() && std::find(devices.begin(), devices.end(), d) == devices.end()) {
          devices.push_back(d);
        }
        p.data = host_snapshot(p.data);
      }
    }
    rng = rng_text(s);
    for (size_t i = 0; i < s.compressors.size(); ++i) {
      for (const auto& [k, v] : s.compressors[i]->state()) {
        comm_state.emplace_back(std::to_string(i) + "/" + k, snapshot ? host_snapshot(v) : v);
      }
    }
    if (rank == 0) {
      tokenizer_dir = s.tokenizer_dir;
      meta = meta_json(s, step, consumed, nonfinite);
      // Note [Sharded saving]: rank 0's writer clears a stale .tmp before the others open it.
      writer = std::make_unique<ck::CheckpointWriter>(path, 0);
    }
    if (s.world != nullptr) s.world->barrier();
    if (rank != 0) writer = std::make_unique<ck::CheckpointWriter>(path, rank);
  }

  // This rank's files (and, on ranks other than 0, its manifest).
  void write() {
    for (const Device& d : devices) wait_host_snapshot(d);
    ck::write_pieces(*writer, rank, pieces);
    writer->write_bytes(rng_file(rank), rng);
    if (!comm_state.empty()) writer->write_tensors(comm_file(rank), comm_state);
    if (!tokenizer_dir.empty()) {
      for (const char* f : {"vocab.json", "merges.txt"}) {
        writer->copy_file(f, join_path(tokenizer_dir, f));
      }
    }
    if (rank != 0) writer->finish();
    pieces.clear();  // the host copies are no longer needed
    comm_state.clear();
  }

  // Rank 0, once every rank's write() has finished: meta.json, the rename, latest.
  void commit() {
    if (rank != 0) return;
    writer->commit(meta, size);
    ck::update_latest(root, name);
  }
};

std::string save_state(const TrainState& s, const std::string& root, int64_t step,
                       int64_t consumed_samples,
                       const std::optional<NonfiniteCounters>& nonfinite) {
  SaveJob job(s, root, step, consumed_samples, nonfinite, false);
  job.write();
  if (s.world != nullptr) s.world->barrier();
  job.commit();
  if (s.world != nullptr) s.world->barrier();  // nobody resumes or exits before it is in place
  return job.path;
}

struct AsyncSaver::Job {
  Job(const TrainState& s, const std::string& root, int64_t step, int64_t consumed,
      const std::optional<NonfiniteCounters>& nonfinite)
      : save(s, root, step, consumed, nonfinite, true) {}
  SaveJob save;
  std::atomic<bool> done{false};
  std::string error;  // set by the thread before done
};

AsyncSaver::AsyncSaver(dist::CommPtr world) : world_(std::move(world)) {}

AsyncSaver::~AsyncSaver() {
  if (thread_.joinable()) thread_.join();
}

std::string AsyncSaver::save(const TrainState& s, const std::string& root, int64_t step,
                             int64_t consumed_samples,
                             const std::optional<NonfiniteCounters>& nonfinite) {
  wait();
  job_ = std::make_shared<Job>(s, root, step, consumed_samples, nonfinite);
  const char* delay_env = std::getenv("TD_TEST_ASYNC_SAVE_DELAY");
  const double delay = delay_env != nullptr ? std::atof(delay_env) : 0.0;
  thread_ = std::thread([job = job_, delay] {
    try {
      if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      job->save.write();
    } catch (const std::exception& e) {
      job->error = e.what();
    } catch (...) {
      job->error = "unknown error";
    }
    job->done.store(true);
  });
  return job_->save.path;
}

std::optional<std::string> AsyncSaver::poll(bool block) {
  if (job_ == nullptr) return std::nullopt;
  if (block && thread_.joinable()) thread_.join();
  bool done = job_->done.load();
  const bool mine_failed = done && !job_->error.empty();
  bool failed = mine_failed;
  if (world_ != nullptr && world_->size() > 1) {
    // (every rank done, some rank failed): one all-reduce of (done, -failed) with min.
    Tensor t = from_vector<int64_t>({done ? 1 : 0, failed ? -1 : 0}, {2});
    world_->all_reduce(t, dist::ReduceOp::Min);
    const std::vector<int64_t> v = to_vector<int64_t>(t);
    done = v[0] == 1;
    failed = v[1] == -1;
  }
  if (failed) {
    if (thread_.joinable()) thread_.join();
    const std::string path = job_->save.path;
    const std::string why = mine_failed ? ": " + job_->error : " on another rank";
    job_ = nullptr;
    TD_ERROR("train: the background save of ", path, " failed", why);
  }
  if (!done) return std::nullopt;
  if (thread_.joinable()) thread_.join();
  job_->save.commit();
  const std::string path = job_->save.path;
  job_ = nullptr;
  return path;
}

// ---- loading ----

namespace {

// The optimizer step count of a checkpoint (a whole-tensor one keeps AdamW's per-parameter
// steps in optimizer.safetensors' metadata).
int64_t saved_step(const ck::CheckpointReader& reader, const json::Value& meta) {
  if (const json::Value* opt = meta.find("optimizer")) return opt->at("step").as_int();
  if (reader.has_file(ck::kOptimizerFile)) {
    const ck::SafetensorsFile f = reader.read_tensors(ck::kOptimizerFile);
    const json::Value saved = json::parse(f.metadata.at("optimizer"));
    int64_t step = 0;
    for (const auto& [n, v] : saved.at("step").as_object()) step = std::max(step, v.as_int());
    return step;
  }
  return 0;
}

// A format-1 checkpoint with tensor-parallel, pipeline or ZeRO shard files is refused by name.
void check_format(const ck::CheckpointReader& reader, const std::string& path) {
  const json::Value* format = reader.meta().find("state_format");
  if (format != nullptr && format->as_int() >= 2) return;
  for (const ck::FileEntry& f : reader.files()) {
    for (const char* prefix : {"model.tp", "model.pp", "optimizer.rank"}) {
      if (f.name.rfind(prefix, 0) == 0) {
        throw ConfigError(path + ": a format-1 checkpoint with per-layout shard files (" + f.name +
                          ", ...); this version reads format 2 (layout-free) and whole-tensor "
                          "checkpoints: load it with the version that wrote it at its layout and "
                          "save again");
      }
    }
  }
}

void check_compatible(const TrainState& s, const json::Value& meta, const std::string& path) {
  const std::string diff = s.chunks.front()->config().diff(ck::config_from_json(meta.at("config")));
  if (!diff.empty()) {
    throw ConfigError("--resume: checkpoint " + path +
                      " was saved from a different model (this run vs the checkpoint):\n" + diff);
  }
  const json::Value* saved = meta.find("train");
  std::vector<std::string> changed;
  for (std::string_view k : kResumeKeys) {
    const json::Value* v = saved != nullptr ? saved->find(k) : nullptr;
    const json::Value mine = find_field(k)->get(*s.cfg);
    if (v != nullptr && !py_equal(*v, mine)) {
      changed.push_back(std::string(k) + ": " + py::repr(mine) + " vs " + py::repr(*v));
    }
  }
  if (!changed.empty()) {
    throw ConfigError("--resume: checkpoint " + path +
                      " was trained with different data settings: " + py::join(", ", changed));
  }
}

void load_tensors(const TrainState& s, const ck::PieceIndex& index, int64_t step) {
  const auto places = places_of(s);
  autograd::NoGradGuard no_grad;
  // ZeRO-3: the model's own tensors hold no values between uses; the shards take them.
  std::map<std::string, Tensor> sharded;
  for (const auto& ch : s.chunks) {
    for (auto& [n, p] : ch->named_parameters()) {
      Tensor value = places.at(n).read(index, n);
      if (s.fsdp != nullptr) {
        sharded[n] = std::move(value);
      } else {
        Tensor dst = p;
        dst.copy_(value);
      }
    }
    for (auto& [n, b] : ch->named_buffers()) {
      Tensor dst = b;
      dst.copy_(index.read_full(n));
    }
  }
  if (s.fsdp != nullptr) s.fsdp->load_full_parameters(sharded);
  if (s.zero != nullptr) {
    for (auto* opt : {s.zero, s.expert_zero}) {
      if (opt == nullptr) continue;
      std::map<std::string, Tensor> state;
      for (const auto& [key, v] : opt->named_state()) {
        if (key == "step") {
          state[key] = full(v.sizes(), static_cast<double>(step), {v.dtype()});
          continue;
        }
        const auto k = parse_zero_key(key);
        if (!k) continue;
        const std::string src = k->kind == "master" ? k->param : k->param + "." + k->kind;
        state[key] = places.at(k->param).read_flat(index, src, k->begin, k->end);
      }
      opt->load_named_state(state);
    }
    // ZeRO-3: the masters are bitwise the parameter shards' values at save time.
    if (s.fsdp != nullptr) s.zero->write_masters_to_param_shards();
    return;
  }
  const auto names = names_by_identity(s);
  optim::OptimizerState sd = s.adamw->state_dict();
  int64_t i = 0;
  for (const auto& g : s.adamw->param_groups()) {
    for (const Tensor& p : g.params) {
      const std::string& n = names.at(p.impl());
      if (index.has(n + ".exp_avg")) {  // else: saved before any optimizer step
        optim::OptimizerState::Param st;
        st.step = step;
        for (const char* kind : kMoments) {
          st.tensors[kind] = places.at(n).read(index, n + "." + kind);
        }
        sd.state[i] = std::move(st);
      }
      ++i;
    }
  }
  s.adamw->load_state_dict(sd);
}

// The dropout streams: this rank's own at the same layout, else rank 0's first chunk's. The block
// linears' state: this rank's own at the same layout, else found by name in every saved rank's
// file (it is the same on every rank holding a layer: Note [Amax reduction]).
void load_rng(const TrainState& s, const ck::CheckpointReader& reader, bool same_layout) {
  const int rank = s.world != nullptr ? s.world->rank() : 0;
  const json::Value& meta = reader.meta();
  if (same_layout && reader.has_file(rng_file(rank))) {
    const json::Value saved = json::parse(reader.read_bytes(rng_file(rank)));
    for (size_t i = 0; i < s.chunks.size(); ++i) {
      const auto& ch = s.chunks[i];
      const json::Value mine = stage_json(*ch);
      const json::Value* found = nullptr;
      for (const json::Value& c : saved.at("chunks").as_array()) {
        if (py_equal(c.at("stage"), mine)) found = &c;
      }
      if (found == nullptr) continue;
      const json::Value* d = found->find("dropout");
      if (d != nullptr && !d->is_null()) ck::generator_from_json(*d, ch->dropout_generator());
      const json::Value* sr = found->find("split_rng");
      if (sr != nullptr && !sr->is_null() && ch->parallelism() != nullptr) {
        ck::generator_from_json(*sr, ch->parallelism()->split_generator());
      }
      if (s.precision != nullptr) s.precision->load_chunk_state(i, {found});
    }
    return;
  }
  if (const json::Value* rng = meta.find("rng")) {
    for (const auto& ch : s.chunks) {
      ck::generator_from_json(rng->at("dropout"), ch->dropout_generator());
    }
  }
  if (s.precision == nullptr) return;
  const json::Value* layout = meta.find("parallel");
  const json::Value* w = layout != nullptr ? layout->find("world") : nullptr;
  const int64_t saved_world = w != nullptr ? w->as_int() : 1;
  std::vector<json::Value> files;
  for (int64_t r = 0; r < saved_world; ++r) {
    if (reader.has_file(rng_file(static_cast<int>(r)))) {
      files.push_back(json::parse(reader.read_bytes(rng_file(static_cast<int>(r)))));
    }
  }
  std::vector<const json::Value*> saved;
  for (const json::Value& f : files) {
    if (const json::Value* cs = f.find("chunks")) {
      for (const json::Value& c : cs->as_array()) saved.push_back(&c);
    }
  }
  for (size_t i = 0; i < s.chunks.size(); ++i) s.precision->load_chunk_state(i, saved);
}

LoadedState load_local(const TrainState& s, const std::string& path) {
  ck::CheckpointReader reader(path);
  const json::Value& meta = reader.meta();
  check_compatible(s, meta, path);
  check_format(reader, path);
  const ck::PieceIndex index(reader);
  LoadedState out;
  out.path = path;
  try {
    load_tensors(s, index, saved_step(reader, meta));
  } catch (const Error& e) {
    throw ConfigError("--resume: " + path + ": " + e.what());
  }
  index.release();  // the data files read (memory)
  const json::Value* layout = meta.find("parallel");
  const bool same_layout = layout != nullptr && py_equal(*layout, layout_json(s));
  load_rng(s, reader, same_layout);
  // Error feedback is per rank: restored at the same layout, else it starts at zero (what the
  // residuals carried is then lost, as after a change of dp in any compressed run).
  const int rank = s.world != nullptr ? s.world->rank() : 0;
  bool comm_restored = false;
  if (!s.compressors.empty() && same_layout && reader.has_file(comm_file(rank))) {
    const ck::SafetensorsFile saved = reader.read_tensors(comm_file(rank));
    for (size_t i = 0; i < s.compressors.size(); ++i) {
      const std::string prefix = std::to_string(i) + "/";
      std::map<std::string, Tensor> mine;
      for (const auto& [k, v] : saved.tensors) {
        if (k.rfind(prefix, 0) == 0) mine[k.substr(prefix.size())] = v;
      }
      s.compressors[i]->load_state(mine);
    }
    comm_restored = true;
  }
  out.error_feedback_reset = !s.compressors.empty() && !comm_restored;
  out.step = meta.at("step").as_int();
  out.consumed_samples = meta.at("data").at("consumed_samples").as_int();
  out.resharded = !same_layout;
  if (const json::Value* ls = meta.find("loss_scaler")) {
    out.loss_scaler =
        optim::LossScalerState{ls->at("scale").as_double(), ls->at("growth_tracker").as_int(),
                               ls->at("skipped_steps").as_int()};
  }
  if (const json::Value* nf = meta.find("nonfinite")) {
    out.nonfinite = NonfiniteCounters{nf->at("skips").as_int(), nf->at("consecutive").as_int()};
  }
  return out;
}

}  // namespace

LoadedState load_state(const TrainState& s, const std::string& path) {
  // Every rank reads the same meta.json, but not the same data files: a damaged file fails
  // only the ranks that read it, and the others must not go on into the first step's
  // collectives. So the outcome is agreed on (one small all-reduce).
  LoadedState out;
  std::exception_ptr error;
  try {
    out = load_local(s, path);
  } catch (...) {
    error = std::current_exception();
  }
  if (s.world != nullptr && s.world->size() > 1) {
    Tensor t = full({1}, error ? 1.0 : 0.0, {DType::Int64});
    s.world->all_reduce(t, dist::ReduceOp::Max);
    if (!error && t.item<int64_t>() != 0) {
      throw ConfigError("--resume: " + path + ": reading the checkpoint failed on another rank");
    }
  }
  if (error) std::rethrow_exception(error);
  return out;
}

std::string resume_path(const std::string& root) {
  if (auto latest = ck::find_latest(root)) return *latest;
  std::string there;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    there = "the directory does not exist";
  } else {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    if (names.empty()) {
      there = "it is empty";
    } else {
      const std::vector<std::string> head(names.begin(),
                                          names.begin() + std::min<size_t>(names.size(), 8));
      there = "it holds " + py::join(", ", head) + (names.size() > 8 ? ", ..." : "") +
              "; a *.tmp directory is a save that never completed";
    }
  }
  throw ConfigError("--resume: no complete checkpoint under " + root + " (" + there +
                    "); drop --resume to start a new run");
}

}  // namespace td::train
