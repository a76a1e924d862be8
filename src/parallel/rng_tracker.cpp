#include "tardelli/parallel/rng_tracker.h"

#include <utility>

#include "tardelli/core/error.h"

namespace td::parallel {

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s.append(s.empty() ? "" : ", ").append("'" + n + "'");
  return s.empty() ? "(none)" : s;
}

}  // namespace

RngTracker RngTracker::model_parallel(uint64_t seed, int tp_rank) {
  TD_CHECK(tp_rank >= 0, "RngTracker::model_parallel: tp_rank must be >= 0, got ", tp_rank);
  RngTracker t;
  t.add(kDefaultRng, seed);
  t.add(kModelParallelRng, seed + kModelParallelSeedOffset + static_cast<uint64_t>(tp_rank));
  return t;
}

void RngTracker::add(const std::string& name, uint64_t seed, uint64_t subsequence) {
  TD_CHECK(!name.empty(), "RngTracker::add: the stream name is empty");
  TD_CHECK(!has(name), "RngTracker::add: stream '", name, "' already exists");
  for (const auto& [other, gen] : streams_) {
    TD_CHECK(gen->seed() != seed || gen->subsequence() != subsequence, "RngTracker::add: seed ",
             seed, " (subsequence ", subsequence, ") of stream '", name,
             "' is already used by stream '", other, "'");
  }
  streams_.emplace(name, std::make_unique<Generator>(seed, subsequence));
}

bool RngTracker::has(const std::string& name) const {
  return streams_.count(name) != 0;
}

Generator& RngTracker::get(const std::string& name) {
  return const_cast<Generator&>(std::as_const(*this).get(name));
}

const Generator& RngTracker::get(const std::string& name) const {
  auto it = streams_.find(name);
  TD_CHECK(it != streams_.end(), "RngTracker: no stream '", name, "' (known: ", join_names(names()),
           ")");
  return *it->second;
}

std::vector<std::string> RngTracker::names() const {
  std::vector<std::string> out;
  for (const auto& kv : streams_) out.push_back(kv.first);
  return out;
}

void RngTracker::reset() {
  streams_.clear();
}

std::map<std::string, PhiloxState> RngTracker::states() const {
  std::map<std::string, PhiloxState> out;
  for (const auto& [name, gen] : streams_)
    out[name] = PhiloxState{gen->seed(), gen->offset(), gen->subsequence()};
  return out;
}

void RngTracker::set_states(const std::map<std::string, PhiloxState>& states) {
  std::vector<std::string> missing, unknown;
  for (const auto& kv : streams_)
    if (!states.count(kv.first)) missing.push_back(kv.first);
  for (const auto& kv : states)
    if (!streams_.count(kv.first)) unknown.push_back(kv.first);
  TD_CHECK(missing.empty() && unknown.empty(),
           "RngTracker::set_states: the states must name exactly the tracker's streams; missing ",
           join_names(missing), ", unknown ", join_names(unknown));
  for (const auto& [name, st] : states)
    streams_.at(name)->set_state(st.seed, st.offset, st.subsequence);
}

}  // namespace td::parallel
