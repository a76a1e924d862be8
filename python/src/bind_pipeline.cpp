// tardelli._C.pipeline: pipeline schedules as data (parallel/pipeline_schedule.h). Type
// conversion only: an action crosses as a (kind, microbatch, chunk) tuple with kind "F", "B",
// "I" (input-gradient backward) or "W" (weight-gradient backward); a timed action as
// (kind, microbatch, chunk, start, end); the Chrome trace as JSON text. The Python layer is
// python/tardelli/distributed/pipeline.py.
#include <tuple>

#include "bind.h"
#include "tardelli/parallel/pipeline_schedule.h"

namespace td::python {

using namespace pybind11::literals;
namespace pp = td::parallel;

namespace {

using ActionTuple = std::tuple<std::string, int, int>;
using TimedTuple = std::tuple<std::string, int, int, double, double>;

ActionTuple to_tuple(const pp::Action& a) {
  return {pp::action_kind_code(a.kind), a.microbatch, a.chunk};
}
pp::Action from_tuple(const ActionTuple& t) {
  return {pp::parse_action_kind(std::get<0>(t)), std::get<1>(t), std::get<2>(t)};
}

std::vector<std::vector<ActionTuple>> action_lists(const pp::PipelineSchedule& s) {
  std::vector<std::vector<ActionTuple>> out(s.actions.size());
  for (size_t r = 0; r < s.actions.size(); ++r) {
    for (const auto& a : s.actions[r]) out[r].push_back(to_tuple(a));
  }
  return out;
}

std::vector<std::vector<TimedTuple>> timed_lists(
    const std::vector<std::vector<pp::TimedAction>>& tl) {
  std::vector<std::vector<TimedTuple>> out(tl.size());
  for (size_t r = 0; r < tl.size(); ++r) {
    for (const auto& t : tl[r]) {
      out[r].emplace_back(pp::action_kind_code(t.action.kind), t.action.microbatch, t.action.chunk,
                          t.start, t.end);
    }
  }
  return out;
}

std::vector<std::vector<pp::TimedAction>> timed_actions(
    const std::vector<std::vector<TimedTuple>>& tl) {
  std::vector<std::vector<pp::TimedAction>> out(tl.size());
  for (size_t r = 0; r < tl.size(); ++r) {
    for (const auto& [kind, mb, chunk, start, end] : tl[r]) {
      out[r].push_back({{pp::parse_action_kind(kind), mb, chunk}, start, end});
    }
  }
  return out;
}

}  // namespace

void init_pipeline(py::module_& m, TensorClass& /*cls*/) {
  py::module_ pm = m.def_submodule("pipeline", "Pipeline-parallel schedules as data (C++)");

  py::class_<pp::PipelineSchedule>(pm, "Schedule",
                                   "One ordered list of (kind, microbatch, chunk) per rank")
      .def(
          py::init([](const std::string& kind, int stages, int microbatches, int chunks,
                      const std::vector<std::vector<ActionTuple>>& actions) {
            pp::PipelineSchedule s{pp::parse_schedule_kind(kind), stages, microbatches, chunks, {}};
            s.actions.resize(actions.size());
            for (size_t r = 0; r < actions.size(); ++r) {
              for (const auto& t : actions[r]) s.actions[r].push_back(from_tuple(t));
            }
            return s;
          }),
          "kind"_a, "stages"_a, "microbatches"_a, "chunks"_a, "actions"_a)
      .def_property_readonly("kind",
                             [](const pp::PipelineSchedule& s) { return pp::to_string(s.kind); })
      .def_readonly("stages", &pp::PipelineSchedule::stages)
      .def_readonly("microbatches", &pp::PipelineSchedule::microbatches)
      .def_readonly("chunks", &pp::PipelineSchedule::chunks)
      .def_property_readonly("actions", &action_lists)
      .def("__repr__", [](const pp::PipelineSchedule& s) {
        return detail::str_cat("Schedule(kind='", pp::to_string(s.kind), "', stages=", s.stages,
                               ", microbatches=", s.microbatches, ", chunks=", s.chunks, ")");
      });

  pm.def(
      "make_schedule",
      [](const std::string& kind, int p, int m, int v) {
        return pp::make_schedule(pp::parse_schedule_kind(kind), p, m, v);
      },
      "kind"_a, "stages"_a, "microbatches"_a, "chunks"_a = 1);
  pm.def("validate", &pp::validate, "schedule"_a, nogil());
  pm.def(
      "simulate",
      [](const pp::PipelineSchedule& s, double tf, double ti, double tw) {
        pp::SimResult r;
        {
          py::gil_scoped_release unlocked;
          r = pp::simulate(s, tf, ti, tw);
        }
        py::dict d;
        d["makespan"] = r.makespan;
        d["busy"] = r.busy;
        d["bubble_fraction"] = r.bubble_fraction;
        d["peak_in_flight"] = r.peak_in_flight;
        d["timeline"] = timed_lists(r.timeline);
        return d;
      },
      "schedule"_a, "t_forward"_a = 1.0, "t_backward_input"_a = 1.0, "t_backward_weight"_a = 1.0);
  pm.def(
      "bubble_formula",
      [](const std::string& kind, int p, int m, int v) {
        return pp::bubble_formula(pp::parse_schedule_kind(kind), p, m, v);
      },
      "kind"_a, "stages"_a, "microbatches"_a, "chunks"_a = 1);
  pm.def(
      "chrome_trace",
      [](const std::vector<std::vector<TimedTuple>>& timeline, int indent) {
        return json::dump(pp::chrome_trace(timed_actions(timeline)), indent);
      },
      "timeline"_a, "indent"_a = -1);
  pm.def(
      "dependencies",
      [](const ActionTuple& a, int rank, int p, int v) {
        std::vector<std::tuple<std::string, int, int, int>> out;
        for (const auto& d : pp::dependencies(from_tuple(a), rank, p, v)) {
          out.emplace_back(d.event == pp::Event::ForwardDone ? "forward" : "input_grad",
                           d.microbatch, d.stage, d.rank);
        }
        return out;
      },
      "action"_a, "rank"_a, "stages"_a, "chunks"_a = 1,
      "[(event, microbatch, virtual stage, producing rank)] the action waits for");
}

}  // namespace td::python
