#pragma once
// Pipeline-parallel schedules as data: a schedule is one ordered list of actions per pipeline
// rank. One generator (make_schedule) writes GPipe, 1F1B, interleaved 1F1B and ZB-H1; one
// checker (validate) proves a list executes without deadlock; one simulator (simulate) times it
// with given per-action costs; chrome_trace turns a simulated or measured timeline into a
// Chrome/Perfetto trace. Nothing here communicates or touches a model: the runtime that executes
// a schedule walks its rank's list in order and, for each action, waits for the action's
// dependencies() (receiving from the rank that produces them), runs it, and sends what it
// produced (Note [Pipeline dependencies]).
//
// Note [Virtual stages]: with v model chunks per rank (interleaved schedules) the model is cut
// into p*v virtual stages; chunk c on rank r is virtual stage s = c*p + r (Megatron's
// interleaved layout: rank 0 holds stages 0, p, 2p, ...). Without interleaving v = 1 and the
// virtual stage is the rank. A micro-batch flows forward through stages 0..p*v-1 and its
// gradient flows back from p*v-1 to 0.
//
// Note [Pipeline dependencies] (the one definition; validate, simulate and the runtime use it):
//   F(mb, s)                    needs F(mb, s-1)                  (from rank_of(s-1); none if s =
//   0) B(mb, s) or BI(mb, s)       needs F(mb, s) on this rank, and the input gradient of (mb,
//   s+1),
//                               produced by B(mb, s+1) or BI(mb, s+1) (from rank_of(s+1); none if
//                               s is the last virtual stage)
//   BW(mb, s)                   needs BI(mb, s) on this rank
// B is the full backward (input and weight gradients); ZB-H1 splits it into BI (input gradient,
// on the critical path) and BW (weight gradient, free to move). Sends are asynchronous: a rank
// never waits for its consumer, only for its producers.
#include <string>
#include <string_view>
#include <vector>

#include "tardelli/core/json.h"

namespace td::parallel {

enum class ActionKind { Forward, Backward, BackwardInput, BackwardWeight };

// One unit of work on one rank: a pass of `microbatch` through this rank's model chunk `chunk`
// (0..v-1; see Note [Virtual stages]).
struct Action {
  ActionKind kind;
  int microbatch;
  int chunk;

  bool operator==(const Action&) const = default;
};

// Short codes used in names, traces and the Python binding: "F", "B", "I" (BackwardInput),
// "W" (BackwardWeight); parse_action_kind is the inverse (td::Error listing the codes).
const char* action_kind_code(ActionKind kind);
ActionKind parse_action_kind(std::string_view code);
// Long names: "forward", "backward", "backward_input", "backward_weight".
const char* action_kind_name(ActionKind kind);
// "F3c1": code, micro-batch, "c", chunk.
std::string to_string(const Action& a);

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };

// "gpipe", "1f1b", "interleaved", "zb"; parse_schedule_kind is the inverse (td::Error listing
// the valid names).
const char* to_string(ScheduleKind kind);
ScheduleKind parse_schedule_kind(std::string_view name);

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 1;                            // p: pipeline ranks
  int microbatches = 1;                      // m
  int chunks = 1;                            // v: model chunks per rank (> 1 only for interleaved)
  std::vector<std::vector<Action>> actions;  // actions[rank], executed in order

  int virtual_stages() const { return stages * chunks; }
};

// Note [Virtual stages] as functions.
inline int virtual_stage(int rank, int chunk, int stages) {
  return chunk * stages + rank;
}
inline int rank_of_stage(int stage, int stages) {
  return stage % stages;
}
inline int chunk_of_stage(int stage, int stages) {
  return stage / stages;
}

// The schedule `kind` for p stages, m micro-batches and v chunks per rank.
//   gpipe:       all m forwards, then all m backwards (both in micro-batch order).
//   1f1b:        Megatron's non-interleaved 1F1B: min(p-r-1, m) warm-up forwards on rank r,
//                then alternating forward/backward, then the remaining backwards.
//   interleaved: Megatron's virtual-pipeline 1F1B (v >= 2 chunks per rank, m a multiple of p).
//   zb:          ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's order of
//                forwards and input-gradient backwards (so the same peak of in-flight
//                activations), with each weight-gradient pass deferred to fill the cool-down.
// td::Error (naming the schedule and the offending value) for p < 1, m < 1, v < 1, v != 1 for a
// non-interleaved schedule, and for interleaved: v < 2, m < p, m % p != 0.
PipelineSchedule make_schedule(ScheduleKind kind, int p, int m, int v = 1);

// What an action waits for (Note [Pipeline dependencies]).
enum class Event {
  ForwardDone,    // F(microbatch, stage) finished
  InputGradDone,  // B(microbatch, stage) or BI(microbatch, stage) finished
};
struct Dependency {
  Event event;
  int microbatch;
  int stage;  // virtual stage of the producing action
  int rank;   // rank that produces it (== the waiting rank: a local dependency; else a receive)
};
// The dependencies of action `a` on `rank` in a pipeline of p ranks with v chunks per rank.
std::vector<Dependency> dependencies(const Action& a, int rank, int p, int v);

// Checks that s is a complete, executable schedule, else throws td::Error naming the rank, the
// action and the rule broken:
//   - one action list per stage; microbatch in [0, m), chunk in [0, v);
//   - every (micro-batch, virtual stage) has exactly one F and either exactly one B or exactly
//     one BI and one BW;
//   - on each rank every backward comes after its forward, and BW after its BI;
//   - executing every rank's list in order, each action waiting for its dependencies (sends
//     never block), finishes: no deadlock.
void validate(const PipelineSchedule& s);

struct TimedAction {
  Action action;
  double start = 0;  // seconds (simulated: in units of the costs given to simulate)
  double end = 0;
};

struct SimResult {
  double makespan = 0;         // time the last rank finishes (every rank starts at 0)
  std::vector<double> busy;    // per rank: total time spent computing
  double bubble_fraction = 0;  // 1 - sum(busy) / (p * makespan)
  // Per rank: the largest number of (micro-batch, chunk) pairs forwarded whose backward (B, or
  // BI for split backwards) is not done yet: the activations the rank holds at its peak.
  std::vector<int> peak_in_flight;
  std::vector<std::vector<TimedAction>> timeline;  // per rank, in execution order
};

// Runs s (after validate) with every action starting as soon as its rank is free and its
// dependencies are done; communication takes no time. A forward costs t_forward, BI
// t_backward_input, BW t_backward_weight and a full B their sum, each divided by v (a chunk holds
// 1/v of a rank's layers, so the total work is the same for every v). td::Error for a negative
// cost.
SimResult simulate(const PipelineSchedule& s, double t_forward = 1, double t_backward_input = 1,
                   double t_backward_weight = 1);

// The textbook bubble fraction (idle time / total time, F = B_input = B_weight in cost):
//   gpipe, 1f1b:  (p-1) / (m+p-1)
//   interleaved:  (p-1) / (v*m + p-1)
//   zb (ZB-H1):   (p-1) / (3m + p-1)   (exact for m >= p; with m < p the cool-down cannot be
//                 filled and the simulated bubble is larger)
// Same argument checks as make_schedule. See the definition for the derivations.
double bubble_formula(ScheduleKind kind, int p, int m, int v = 1);

// Chrome trace event format ({"traceEvents": [...]}, loadable in chrome://tracing and Perfetto):
// one complete event (ph "X") per action with pid = rank, tid 0, ts/dur in microseconds (times
// are seconds), name "F3" (or "F3c1" when any action uses a chunk > 0), a color (cname) per
// kind and args {microbatch, chunk, kind}; plus one process_name metadata event (ph "M") per
// rank.
json::Value chrome_trace(const std::vector<std::vector<TimedAction>>& per_rank_timeline);

}  // namespace td::parallel
