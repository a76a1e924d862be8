// Pipeline schedules: the generators (after Megatron-LM's schedules.py and the ZB-H1 schedule of
// sail-sg/zero-bubble-pipeline-parallelism), the checker, the simulator and the trace writer.
#include "tardelli/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "tardelli/core/error.h"

namespace td::parallel {

// ---------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------

const char* action_kind_code(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
      return "F";
    case ActionKind::Backward:
      return "B";
    case ActionKind::BackwardInput:
      return "I";
    case ActionKind::BackwardWeight:
      return "W";
  }
  return "?";
}

const char* action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward:
      return "forward";
    case ActionKind::Backward:
      return "backward";
    case ActionKind::BackwardInput:
      return "backward_input";
    case ActionKind::BackwardWeight:
      return "backward_weight";
  }
  return "?";
}

ActionKind parse_action_kind(std::string_view code) {
  for (ActionKind k : {ActionKind::Forward, ActionKind::Backward, ActionKind::BackwardInput,
                       ActionKind::BackwardWeight}) {
    if (code == action_kind_code(k) || code == action_kind_name(k)) return k;
  }
  TD_ERROR("pipeline: unknown action kind '", code,
           "' (expected F, B, I or W: forward, backward, backward_input, backward_weight)");
}

std::string to_string(const Action& a) {
  return detail::str_cat(action_kind_code(a.kind), a.microbatch, "c", a.chunk);
}

const char* to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved:
      return "interleaved";
    case ScheduleKind::ZeroBubbleH1:
      return "zb";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                         ScheduleKind::ZeroBubbleH1}) {
    if (name == to_string(k)) return k;
  }
  TD_ERROR("pipeline: unknown schedule '", name,
           "' (valid schedules: gpipe, 1f1b, interleaved, zb)");
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

namespace {

void check_args(ScheduleKind kind, int p, int m, int v) {
  const char* name = to_string(kind);
  TD_CHECK(p >= 1, name, " schedule: pipeline stages must be >= 1, got ", p);
  TD_CHECK(m >= 1, name, " schedule: micro-batches must be >= 1, got ", m);
  TD_CHECK(v >= 1, name, " schedule: model chunks per rank must be >= 1, got ", v);
  if (kind != ScheduleKind::Interleaved) {
    TD_CHECK(v == 1, name, " schedule: takes one model chunk per rank, got ", v,
             " (virtual stages need the 'interleaved' schedule)");
    return;
  }
  TD_CHECK(v >= 2, "interleaved schedule: needs at least 2 model chunks per rank, got ", v,
           " (use '1f1b' for one chunk)");
  TD_CHECK(m >= p, "interleaved schedule: ", m, " micro-batches < ", p, " pipeline stages");
  TD_CHECK(m % p == 0, "interleaved schedule: ", m, " micro-batches is not a multiple of the ", p,
           " pipeline stages");
}

Action fwd(int mb, int chunk = 0) {
  return {ActionKind::Forward, mb, chunk};
}
Action bwd(int mb, int chunk = 0) {
  return {ActionKind::Backward, mb, chunk};
}

std::vector<Action> gpipe_rank(int m) {
  std::vector<Action> a;
  for (int i = 0; i < m; ++i) a.push_back(fwd(i));
  for (int i = 0; i < m; ++i) a.push_back(bwd(i));
  return a;
}

// Megatron's forward_backward_pipelining_without_interleaving: rank r runs min(p-r-1, m)
// warm-up forwards (enough that the backward of micro-batch 0 reaches it just as it is needed),
// then one forward + one backward per step, then the backwards that are left.
std::vector<Action> one_f_one_b_rank(int p, int m, int r) {
  const int warmup = std::min(p - r - 1, m);
  const int steady = m - warmup;
  std::vector<Action> a;
  for (int i = 0; i < warmup; ++i) a.push_back(fwd(i));
  for (int i = 0; i < steady; ++i) {
    a.push_back(fwd(warmup + i));
    a.push_back(bwd(i));
  }
  for (int i = steady; i < m; ++i) a.push_back(bwd(i));
  return a;
}

// Megatron's forward_backward_pipelining_with_interleaving. The m*v (micro-batch, chunk) passes
// of a rank are numbered k = 0..m*v-1 in groups of p micro-batches per chunk: k walks chunk 0
// for micro-batches 0..p-1, then chunk 1 for the same p, ..., then chunk 0 for p..2p-1, etc.
// Forwards visit chunks in increasing order, backwards in decreasing order. Warm-up:
// (p-r-1)*2 + (v-1)*p forwards (capped at m*v), then 1F1B over k, then the remaining backwards.
// Megatron also makes every pass a warm-up pass when m == p; that exists for its blocking
// send/recv pairing, which our asynchronous sends do not need, so it is not reproduced.
std::vector<Action> interleaved_rank(int p, int m, int v, int r) {
  const int total = m * v;
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
  const int steady = total - warmup;
  std::vector<Action> a;
  for (int k = 0; k < warmup; ++k) a.push_back(fwd(mb_of(k), chunk_of(k, true)));
  for (int k = 0; k < steady; ++k) {
    a.push_back(fwd(mb_of(warmup + k), chunk_of(warmup + k, true)));
    a.push_back(bwd(mb_of(k), chunk_of(k, false)));
  }
  for (int k = steady; k < total; ++k) a.push_back(bwd(mb_of(k), chunk_of(k, false)));
  return a;
}

// ZB-H1. Forwards and input-gradient backwards (BI) keep 1F1B's order, so the in-flight peak is
// 1F1B's. With F = BI = BW, the BI wave travels back one stage per time unit instead of two, so
// rank r first waits p-1-r units for BI(0) (1F1B: 2(p-1-r)) and the steady state is
// F, BI, BW on every rank. What remains is the cool-down: rank r receives its last BIs every 2
// units only if every later rank already runs BI after BI without a BW in between. Rank r
// therefore keeps its BW passes r behind its BIs (BW(k-r) follows BI(k)); the r deferred BWs run
// after its last BI, filling the time in which the last BIs travel down to rank 0. Rank r then
// ends at 3m + p - 1 like every other rank: the idle time per rank is p - 1 units, a third of
// 1F1B's 3(p-1). This is the schedule of the paper's figure 3 (handcrafted ZB-H1).
std::vector<Action> zero_bubble_h1_rank(int p, int m, int r) {
  const int warmup = std::min(p - r - 1, m);
  const int steady = m - warmup;
  const int lag = r;  // BW passes held back behind the BI passes
  std::vector<Action> a;
  int next_w = 0;
  auto input_backward = [&](int i) {
    a.push_back({ActionKind::BackwardInput, i, 0});
    if (i - next_w >= lag) a.push_back({ActionKind::BackwardWeight, next_w++, 0});
  };
  for (int i = 0; i < warmup; ++i) a.push_back(fwd(i));
  for (int i = 0; i < steady; ++i) {
    a.push_back(fwd(warmup + i));
    input_backward(i);
  }
  for (int i = steady; i < m; ++i) input_backward(i);
  while (next_w < m) a.push_back({ActionKind::BackwardWeight, next_w++, 0});
  return a;
}

}  // namespace

PipelineSchedule make_schedule(ScheduleKind kind, int p, int m, int v) {
  check_args(kind, p, m, v);
  PipelineSchedule s{kind, p, m, v, {}};
  s.actions.resize(p);
  for (int r = 0; r < p; ++r) {
    switch (kind) {
      case ScheduleKind::GPipe:
        s.actions[r] = gpipe_rank(m);
        break;
      case ScheduleKind::OneFOneB:
        s.actions[r] = one_f_one_b_rank(p, m, r);
        break;
      case ScheduleKind::Interleaved:
        s.actions[r] = interleaved_rank(p, m, v, r);
        break;
      case ScheduleKind::ZeroBubbleH1:
        s.actions[r] = zero_bubble_h1_rank(p, m, r);
        break;
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Dependencies, validation, simulation
// ---------------------------------------------------------------------------------------------

std::vector<Dependency> dependencies(const Action& a, int rank, int p, int v) {
  const int s = virtual_stage(rank, a.chunk, p);
  const int last = p * v - 1;
  std::vector<Dependency> deps;
  switch (a.kind) {
    case ActionKind::Forward:
      if (s > 0) deps.push_back({Event::ForwardDone, a.microbatch, s - 1, rank_of_stage(s - 1, p)});
      break;
    case ActionKind::Backward:
    case ActionKind::BackwardInput:
      deps.push_back({Event::ForwardDone, a.microbatch, s, rank});
      if (s < last) {
        deps.push_back({Event::InputGradDone, a.microbatch, s + 1, rank_of_stage(s + 1, p)});
      }
      break;
    case ActionKind::BackwardWeight:
      deps.push_back({Event::InputGradDone, a.microbatch, s, rank});
      break;
  }
  return deps;
}

namespace {

std::string describe(const Dependency& d) {
  return detail::str_cat(d.event == Event::ForwardDone ? "the forward" : "the input gradient",
                         " of micro-batch ", d.microbatch, " at virtual stage ", d.stage, " (rank ",
                         d.rank, ")");
}

// Static checks: shape, ranges, one F and one backward (B, or BI + BW) per (mb, stage), and the
// per-rank order of F < B/BI < BW. Throws on the first violation.
void check_structure(const PipelineSchedule& s) {
  const int p = s.stages, m = s.microbatches, v = s.chunks;
  TD_CHECK(p >= 1 && m >= 1 && v >= 1,
           "validate: stages, micro-batches and chunks must be >= 1,"
           " got p=",
           p, " m=", m, " v=", v);
  TD_CHECK(static_cast<int>(s.actions.size()) == p, "validate: ", s.actions.size(),
           " action lists for ", p, " pipeline stages (one per rank)");
  enum { kF, kB, kBI, kBW, kKinds };
  for (int r = 0; r < p; ++r) {
    // Position of each kind of action for (micro-batch, chunk) on this rank; -1: absent.
    std::vector<int> pos(static_cast<size_t>(m) * v * kKinds, -1);
    auto slot = [&](const Action& a, int kind) -> int& {
      return pos[(static_cast<size_t>(a.chunk) * m + a.microbatch) * kKinds + kind];
    };
    const auto& list = s.actions[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const std::string name = to_string(a);
      TD_CHECK(a.microbatch >= 0 && a.microbatch < m, "validate: rank ", r, " action ", i, " (",
               name, "): micro-batch ", a.microbatch, " is outside [0, ", m, ")");
      TD_CHECK(a.chunk >= 0 && a.chunk < v, "validate: rank ", r, " action ", i, " (", name,
               "): chunk ", a.chunk, " is outside [0, ", v, ")");
      const int kind = a.kind == ActionKind::Forward         ? kF
                       : a.kind == ActionKind::Backward      ? kB
                       : a.kind == ActionKind::BackwardInput ? kBI
                                                             : kBW;
      TD_CHECK(slot(a, kind) < 0, "validate: rank ", r, " runs ", name, " twice (actions ",
               slot(a, kind), " and ", i, "): each pass must run exactly once");
      slot(a, kind) = static_cast<int>(i);
      if (kind == kB || kind == kBI) {
        TD_CHECK(slot(a, kF) >= 0, "validate: rank ", r, " action ", i, " (", name,
                 ") is a backward before the forward of micro-batch ", a.microbatch, " chunk ",
                 a.chunk, " on that rank");
      }
      if (kind == kBW) {
        TD_CHECK(slot(a, kBI) >= 0, "validate: rank ", r, " action ", i, " (", name,
                 ") is a weight-gradient backward before its input-gradient backward (I",
                 a.microbatch, "c", a.chunk, ")");
      }
    }
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) {
        const Action f{ActionKind::Forward, mb, c};
        const std::string where = detail::str_cat("micro-batch ", mb, " chunk ", c,
                                                  " (virtual stage ", virtual_stage(r, c, p), ")");
        TD_CHECK(slot(f, kF) >= 0, "validate: rank ", r, " never runs the forward F", mb, "c", c,
                 " of ", where);
        const bool full = slot(f, kB) >= 0, in = slot(f, kBI) >= 0, w = slot(f, kBW) >= 0;
        TD_CHECK(!(full && (in || w)), "validate: rank ", r, " runs both a full backward B", mb,
                 "c", c, " and a split one (I/W) for ", where);
        TD_CHECK(full || (in && w), "validate: rank ", r, " is missing ",
                 in ? detail::str_cat("the weight-gradient backward W", mb, "c", c)
                    : detail::str_cat("the backward B", mb, "c", c, " (or I", mb, "c", c, " + W",
                                      mb, "c", c, ")"),
                 " of ", where);
      }
    }
  }
}

// Executes every rank's list in order with the given costs (Note [Pipeline dependencies]). Each
// action starts when its rank is free and its dependencies have finished. Throws a deadlock error
// naming every blocked rank, its next action and what that action waits for.
SimResult execute(const PipelineSchedule& s, double tf, double ti, double tw) {
  const int p = s.stages, m = s.microbatches, v = s.chunks;
  const size_t n = static_cast<size_t>(m) * p * v;
  constexpr double kNotYet = std::numeric_limits<double>::infinity();
  // Finish time per (micro-batch, virtual stage), per event.
  std::vector<double> fwd_done(n, kNotYet), grad_done(n, kNotYet);
  auto at = [&](int mb, int stage) { return static_cast<size_t>(stage) * m + mb; };
  auto done_time = [&](const Dependency& d) {
    return d.event == Event::ForwardDone ? fwd_done[at(d.microbatch, d.stage)]
                                         : grad_done[at(d.microbatch, d.stage)];
  };
  const double scale = 1.0 / v;
  auto cost = [&](ActionKind k) {
    switch (k) {
      case ActionKind::Forward:
        return tf * scale;
      case ActionKind::Backward:
        return (ti + tw) * scale;
      case ActionKind::BackwardInput:
        return ti * scale;
      case ActionKind::BackwardWeight:
        return tw * scale;
    }
    return 0.0;
  };

  SimResult res;
  res.busy.assign(p, 0.0);
  res.peak_in_flight.assign(p, 0);
  res.timeline.assign(p, {});
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);
  std::vector<int> in_flight(p, 0);
  size_t remaining = 0;
  for (const auto& l : s.actions) remaining += l.size();

  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < p; ++r) {
      // Run rank r as far as its dependencies allow.
      while (next[r] < s.actions[r].size()) {
        const Action& a = s.actions[r][next[r]];
        double start = free_at[r];
        bool ready = true;
        for (const Dependency& d : dependencies(a, r, p, v)) {
          const double t = done_time(d);
          if (t == kNotYet) {
            ready = false;
            break;
          }
          start = std::max(start, t);
        }
        if (!ready) break;
        const double end = start + cost(a.kind);
        const int stage = virtual_stage(r, a.chunk, p);
        if (a.kind == ActionKind::Forward) {
          fwd_done[at(a.microbatch, stage)] = end;
          res.peak_in_flight[r] = std::max(res.peak_in_flight[r], ++in_flight[r]);
        } else if (a.kind != ActionKind::BackwardWeight) {
          grad_done[at(a.microbatch, stage)] = end;
          --in_flight[r];
        }
        res.timeline[r].push_back({a, start, end});
        res.busy[r] += end - start;
        free_at[r] = end;
        ++next[r];
        --remaining;
        progressed = true;
      }
    }
    if (progressed) continue;
    std::ostringstream os;
    os << "validate: " << to_string(s.kind) << " schedule (p=" << p << ", m=" << m << ", v=" << v
       << ") deadlocks:";
    for (int r = 0; r < p; ++r) {
      if (next[r] >= s.actions[r].size()) continue;
      const Action& a = s.actions[r][next[r]];
      os << " rank " << r << " blocks at action " << next[r] << " (" << to_string(a)
         << ") waiting for";
      for (const Dependency& d : dependencies(a, r, p, v)) {
        if (done_time(d) == kNotYet) os << " " << describe(d) << ";";
      }
    }
    TD_ERROR(os.str());
  }
  for (int r = 0; r < p; ++r) res.makespan = std::max(res.makespan, free_at[r]);
  double busy = 0;
  for (double b : res.busy) busy += b;
  res.bubble_fraction = res.makespan > 0 ? 1.0 - busy / (p * res.makespan) : 0.0;
  return res;
}

}  // namespace

void validate(const PipelineSchedule& s) {
  check_structure(s);
  execute(s, 1, 1, 1);
}

SimResult simulate(const PipelineSchedule& s, double t_forward, double t_backward_input,
                   double t_backward_weight) {
  TD_CHECK(t_forward >= 0 && t_backward_input >= 0 && t_backward_weight >= 0 &&
               std::isfinite(t_forward + t_backward_input + t_backward_weight),
           "simulate: costs must be finite and >= 0, got t_forward=", t_forward,
           " t_backward_input=", t_backward_input, " t_backward_weight=", t_backward_weight);
  check_structure(s);
  return execute(s, t_forward, t_backward_input, t_backward_weight);
}

// Bubble fractions with F = BI = BW = 1 (a full backward costs 2), bubble = idle / (p * makespan):
//   gpipe, 1f1b: the first forward reaches the last rank after p-1 units and the last backward
//     leaves rank 1 (p-1) * 2 units before rank 0 ends, so every rank idles (p-1)*(1+2) of a
//     makespan 3m + 3(p-1): (p-1) / (m+p-1).
//   interleaved: each chunk pass costs 1/v, so the fill and drain shrink to (p-1)*3/v while the
//     work stays 3m: (p-1)/v / (m + (p-1)/v) = (p-1) / (v*m + p-1). (Narayanan et al. 2021 write
//     the same bubble as (p-1)/(v*m) relative to the ideal time; we divide by the actual time so
//     that it is comparable with the measured 1 - busy/total.)
//   zb: ZB-H1 idles (p-1)*(F + BI - BW) = p-1 units per rank (the comment on
//     zero_bubble_h1_rank), of a makespan 3m + p-1: (p-1) / (3m + p-1), a third of 1F1B's idle
//     time; for large m the fraction tends to a third of 1F1B's.
double bubble_formula(ScheduleKind kind, int p, int m, int v) {
  check_args(kind, p, m, v);
  const double pm1 = p - 1;
  switch (kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
      return pm1 / (m + pm1);
    case ScheduleKind::Interleaved:
      return pm1 / (static_cast<double>(v) * m + pm1);
    case ScheduleKind::ZeroBubbleH1:
      return pm1 / (3.0 * m + pm1);
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Chrome trace
// ---------------------------------------------------------------------------------------------

json::Value chrome_trace(const std::vector<std::vector<TimedAction>>& per_rank_timeline) {
  bool chunked = false;
  for (const auto& rank : per_rank_timeline) {
    for (const auto& t : rank) chunked = chunked || t.action.chunk != 0;
  }
  // Reserved trace-viewer color names: green forwards, red full backwards, blue input-gradient
  // and yellow weight-gradient backwards.
  auto color = [](ActionKind k) {
    switch (k) {
      case ActionKind::Forward:
        return "good";
      case ActionKind::Backward:
        return "terrible";
      case ActionKind::BackwardInput:
        return "rail_response";
      case ActionKind::BackwardWeight:
        return "yellow";
    }
    return "generic_work";
  };
  json::Array events;
  for (size_t r = 0; r < per_rank_timeline.size(); ++r) {
    const int rank = static_cast<int>(r);
    events.push_back(json::Object{{"name", "process_name"},
                                  {"ph", "M"},
                                  {"pid", rank},
                                  {"tid", 0},
                                  {"args", json::Object{{"name", detail::str_cat("rank ", r)}}}});
    for (const auto& t : per_rank_timeline[r]) {
      TD_CHECK(t.end >= t.start, "chrome_trace: rank ", r, " action ", to_string(t.action),
               " ends (", t.end, ") before it starts (", t.start, ")");
      std::string name = detail::str_cat(action_kind_code(t.action.kind), t.action.microbatch);
      if (chunked) name += detail::str_cat("c", t.action.chunk);
      events.push_back(
          json::Object{{"name", name},
                       {"cat", action_kind_name(t.action.kind)},
                       {"ph", "X"},
                       {"pid", rank},
                       {"tid", 0},
                       {"ts", t.start * 1e6},
                       {"dur", (t.end - t.start) * 1e6},
                       {"cname", color(t.action.kind)},
                       {"args", json::Object{{"microbatch", t.action.microbatch},
                                             {"chunk", t.action.chunk},
                                             {"kind", action_kind_name(t.action.kind)}}}});
    }
  }
  return json::Object{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

}  // namespace td::parallel
