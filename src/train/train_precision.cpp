// The training loop's block-linear precision (include/tardelli/train/train_precision.h): what
// one set-up, one agreement per step, the rng files' chunk state.
#include "tardelli/train/train_precision.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "tardelli/core/error.h"
#include "tardelli/ops/factory.h"
#include "tardelli/parallel/precision_sync.h"

namespace td::train {

namespace dist = td::distributed;
using models::LinearPrecision;

namespace {

// The metrics' precision codes: default 0, fp8 1, bf16 2, fp32 3 (LinearPrecision's order).
int64_t code_of(LinearPrecision p) {
  return static_cast<int64_t>(p);
}

const char* code_name(int64_t c) {
  return models::precision_name(static_cast<LinearPrecision>(c));
}

// {"fp8": n, "bf16": n, "fp32": n}: how many of `codes` run in each precision.
json::Value counts_json(const std::vector<int64_t>& codes) {
  json::Value out = json::Object{};
  for (int64_t c : {1, 2, 3}) {
    out.set(code_name(c), static_cast<int64_t>(std::count(codes.begin(), codes.end(), c)));
  }
  return out;
}

json::Value fp8_state_json(models::GPT& g) {
  json::Array out;
  for (auto& st : g.fp8_states()) {
    json::Array three;
    for (const Fp8Scaling* sc : {&st.input, &st.weight, &st.grad}) {
      json::Array h;
      for (double a : sc->history()) h.emplace_back(a);
      three.push_back(json::Array{json::Value(sc->scale()), json::Value(std::move(h))});
    }
    out.push_back(std::move(three));
  }
  return out;
}

void set_scaling(Fp8Scaling& sc, const json::Value& v) {
  std::vector<double> h;
  const json::Array& pair = v.as_array();
  TD_CHECK(pair.size() == 2, "checkpoint: an FP8 scaling is [scale, [amax...]], got ", pair.size(),
           " entries");
  for (const json::Value& a : pair[1].as_array()) h.push_back(a.as_double());
  sc.set_state(pair[0].as_double(), h);
}

}  // namespace

bool precision_active(const TrainConfig& cfg) {
  return cfg.fp8 != "none" || cfg.precision_policy == "adaptive" || !cfg.precision_map.empty();
}

BlockPrecision::BlockPrecision(const TrainConfig& cfg,
                               std::vector<std::shared_ptr<models::GPT>> chunks,
                               dist::CommPtr group, dist::CommPtr pp_group)
    : chunks_(std::move(chunks)), group_(std::move(group)), pp_group_(std::move(pp_group)) {
  const bool adaptive = cfg.precision_policy == "adaptive";
  report_ = adaptive || !cfg.precision_map.empty();
  n_layer_ = cfg.layers;
  std::map<std::string, LinearPrecision> pmap;
  if (!cfg.precision_map.empty()) pmap = read_precision_map(cfg.precision_map, cfg.layers);
  const LinearPrecision lowest = cfg.fp8 != "none" ? LinearPrecision::FP8 : LinearPrecision::BF16;
  models::PrecisionPolicyOptions o;
  o.fp8_overflow = cfg.precision_fp8_overflow;
  o.fp8_underflow = cfg.precision_fp8_underflow;
  o.fp8_error = cfg.precision_fp8_error;
  o.bf16_error = cfg.precision_bf16_error;
  o.stable_steps = cfg.precision_stable_steps;
  for (auto& ch : chunks_) {
    if (cfg.fp8 != "none") {
      ch->set_fp8(cfg.fp8_amax_history, cfg.fp8_margin,
                  cfg.fp8 == "hybrid" ? Fp8Recipe::Hybrid : Fp8Recipe::E4M3);
    }
    const std::vector<std::string> names = ch->linear_names();
    auto in_map = [&](const std::string& n, LinearPrecision otherwise) {
      auto it = pmap.find(n);
      return it != pmap.end() ? it->second : otherwise;
    };
    std::shared_ptr<models::PrecisionPolicy> policy;
    if (adaptive) {
      // Note [Adaptive precision]: a map entry is that linear's floor.
      std::vector<LinearPrecision> floors;
      for (const auto& n : names) floors.push_back(in_map(n, lowest));
      policy = std::make_shared<models::PrecisionPolicy>(names, floors, o);
      ch->block_linears().set_precisions(policy->precisions());
      ch->block_linears().set_monitor(true);
    } else if (!pmap.empty()) {
      std::vector<LinearPrecision> ps;
      for (const auto& n : names) ps.push_back(in_map(n, LinearPrecision::Default));
      ch->block_linears().set_precisions(ps);
    }
    policies_.push_back(std::move(policy));
  }
}

std::vector<int64_t> BlockPrecision::global_codes() const {
  std::vector<int64_t> codes(static_cast<size_t>(4 * n_layer_), 0);
  for (const auto& ch : chunks_) {
    const size_t first = static_cast<size_t>(4 * ch->stage().first_layer);
    const models::BlockLinears& bl = ch->block_linears();
    for (size_t i = 0; i < bl.size(); ++i) codes[first + i] = code_of(bl.precision(i));
  }
  if (pp_group_ != nullptr && report_) {
    Tensor t = from_vector<int64_t>(codes, {static_cast<int64_t>(codes.size())});
    pp_group_->all_reduce(t, dist::ReduceOp::Max);
    codes = to_vector<int64_t>(t);
  }
  return codes;
}

std::optional<json::Value> BlockPrecision::step() {
  if (report_ && !codes_) codes_ = global_codes();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    parallel::precision_step(*chunks_[i], policies_[i].get(), group_);
  }
  if (!report_) return std::nullopt;
  const std::vector<int64_t> codes = global_codes();
  const std::vector<std::string> names = models::block_linear_names(0, n_layer_);
  json::Value rec = counts_json(codes);
  json::Array changes;
  for (size_t i = 0; i < codes.size(); ++i) {
    if ((*codes_)[i] != codes[i]) {
      changes.emplace_back(names[i] + ":" + code_name((*codes_)[i]) + "->" + code_name(codes[i]));
    }
  }
  if (!changes.empty()) rec.set("changes", std::move(changes));
  codes_ = codes;
  return rec;
}

json::Value BlockPrecision::summary_counts() const {
  return counts_json(codes_ ? *codes_ : std::vector<int64_t>{});
}

bool BlockPrecision::replicated(const dist::CommPtr& world) const {
  if (world == nullptr || world->size() == 1 || !codes_ || codes_->empty()) return true;
  const int64_t n = static_cast<int64_t>(codes_->size());
  Tensor hi = from_vector<int64_t>(*codes_, {n}), lo = from_vector<int64_t>(*codes_, {n});
  world->all_reduce(hi, dist::ReduceOp::Max);
  world->all_reduce(lo, dist::ReduceOp::Min);
  return to_vector<int64_t>(hi) == to_vector<int64_t>(lo);
}

json::Value BlockPrecision::chunk_state(size_t i) const {
  models::GPT& ch = *chunks_.at(i);
  json::Value out = json::Object{};
  json::Array linears;
  for (const std::string& n : ch.linear_names()) linears.emplace_back(n);
  out.set("linears", std::move(linears));
  if (ch.fp8()) out.set("fp8", fp8_state_json(ch));
  if (const auto& policy = policies_.at(i)) {
    json::Array ps, stable;
    for (LinearPrecision p : policy->precisions()) ps.emplace_back(models::precision_name(p));
    for (int64_t s : policy->stable_counts()) stable.emplace_back(s);
    out.set("precision", json::Object{{"precisions", json::Value(std::move(ps))},
                                      {"stable", json::Value(std::move(stable))}});
  }
  return out;
}

void BlockPrecision::load_chunk_state(size_t i, const std::vector<const json::Value*>& saved) {
  models::GPT& ch = *chunks_.at(i);
  const std::vector<std::string> names = ch.linear_names();
  std::map<std::string, const json::Value*> fp8;
  std::map<std::string, std::pair<std::string, int64_t>> prec;
  for (const json::Value* c : saved) {
    const json::Value* linears = c->find("linears");
    if (linears == nullptr) continue;
    const json::Value* f = c->find("fp8");
    const json::Value* p = c->find("precision");
    const json::Array& ls = linears->as_array();
    for (size_t k = 0; k < ls.size(); ++k) {
      const std::string& n = ls[k].as_string();
      if (f != nullptr && !f->is_null()) fp8.emplace(n, &f->as_array().at(k));
      if (p != nullptr && !p->is_null()) {
        prec.emplace(n, std::make_pair(p->at("precisions").as_array().at(k).as_string(),
                                       p->at("stable").as_array().at(k).as_int()));
      }
    }
  }
  auto all_found = [&](const auto& m) {
    for (const auto& n : names) {
      if (m.find(n) == m.end()) return false;
    }
    return true;
  };
  if (ch.fp8() && all_found(fp8)) {
    auto& mine = ch.fp8_states();
    for (size_t k = 0; k < names.size(); ++k) {
      const json::Value& s = *fp8.at(names[k]);
      TD_CHECK(s.as_array().size() == 3, "checkpoint: FP8 state of ", names[k],
               " needs 3 scalings, got ", s.as_array().size());
      set_scaling(mine[k].input, s.as_array()[0]);
      set_scaling(mine[k].weight, s.as_array()[1]);
      set_scaling(mine[k].grad, s.as_array()[2]);
    }
  }
  const auto& policy = policies_.at(i);
  if (policy != nullptr && all_found(prec)) {
    for (const auto& n : names) {
      const auto& [p, stable] = prec.at(n);
      policy->set_state(n, models::parse_precision(p, "checkpoint precision of " + n), stable);
    }
    ch.block_linears().set_precisions(policy->precisions());
  }
}

}  // namespace td::train
