// tardelli._C.pipeline: pipeline schedules as data (parallel/pipeline_schedule.h) and the
// runtime that executes them (parallel/pipeline_runtime.h). Type conversion only: an action
// crosses as a (kind, microbatch, chunk) tuple with kind "F", "B", "I" (input-gradient backward)
// or "W" (weight-gradient backward); a timed action as (kind, microbatch, chunk, start, end); the
// Chrome trace as JSON text; a micro-batch as an (x, y) pair of tensors (None for one a stage
// does not read). The Python layers are python/tardelli/distributed/pipeline.py and
// pipeline_parallel.py.
#include <optional>
#include <tuple>

#include "bind.h"
#include "tardelli/parallel/pipeline_runtime.h"
#include "tardelli/parallel/pipeline_schedule.h"

namespace td::python {

using namespace pybind11::literals;
namespace pp = td::parallel;

namespace {

using ActionTuple = std::tuple<std::string, int, int>;

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

std::vector<TimedTuple> timed_list(const std::vector<pp::TimedAction>& tl) {
  std::vector<TimedTuple> out;
  out.reserve(tl.size());
  for (const auto& t : tl) {
    out.emplace_back(pp::action_kind_code(t.action.kind), t.action.microbatch, t.action.chunk,
                     t.start, t.end);
  }
  return out;
}

using BatchTuple = std::tuple<std::optional<Tensor>, std::optional<Tensor>>;

std::vector<pp::MicroBatch> micro_batches(const std::vector<BatchTuple>& batches) {
  std::vector<pp::MicroBatch> out;
  out.reserve(batches.size());
  for (const auto& [x, y] : batches) out.push_back({or_undefined(x), or_undefined(y)});
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

  pm.def(
      "stage_layout",
      [](int64_t n_layer, int p, int v, const std::optional<std::vector<int64_t>>& layout) {
        return pp::stage_layout(n_layer, p, v, layout.value_or(std::vector<int64_t>{}));
      },
      "n_layer"_a, "pp"_a, "vpp"_a = 1, "layout"_a = py::none());
  pm.def(
      "build_pipeline_stages",
      [](const models::GPTConfig& config, int pp_rank, int p, int v,
         const std::optional<std::vector<int64_t>>& layout) {
        const std::vector<int64_t> l = layout.value_or(std::vector<int64_t>{});
        py::gil_scoped_release unlocked;
        return pp::build_pipeline_stages(config, pp_rank, p, v, l);
      },
      "config"_a, "pp_rank"_a, "pp"_a, "vpp"_a = 1, "layout"_a = py::none());

  py::class_<pp::PipelineRuntime, std::shared_ptr<pp::PipelineRuntime>>(
      pm, "PipelineRuntime", "Executes this rank's action list of a schedule over its GPT chunks")
      .def(py::init([](std::vector<std::shared_ptr<models::GPT>> chunks,
                       const distributed::ProcessGrid& grid, const std::string& kind,
                       int microbatches, int64_t micro_batch_size, int64_t seq_len) {
             const pp::ScheduleKind k = pp::parse_schedule_kind(kind);
             py::gil_scoped_release unlocked;  // collective over the world (gpt2 with pp > 1)
             return std::make_shared<pp::PipelineRuntime>(std::move(chunks), grid, k, microbatches,
                                                          micro_batch_size, seq_len);
           }),
           "chunks"_a, "grid"_a, "schedule"_a, "microbatches"_a, "micro_batch_size"_a, "seq_len"_a)
      .def(
          "step",
          [](pp::PipelineRuntime& r, const std::vector<BatchTuple>& batches, double loss_scale) {
            const std::vector<pp::MicroBatch> mbs = micro_batches(batches);
            py::gil_scoped_release unlocked;
            return r.step(mbs, loss_scale);
          },
          "batches"_a, "loss_scale"_a = 1.0)
      .def(
          "forward_only",
          [](pp::PipelineRuntime& r, const std::vector<BatchTuple>& batches) {
            const std::vector<pp::MicroBatch> mbs = micro_batches(batches);
            py::gil_scoped_release unlocked;
            return r.forward_only(mbs);
          },
          "batches"_a)
      .def_property("sync_tied_grads", &pp::PipelineRuntime::sync_tied_grads,
                    &pp::PipelineRuntime::set_sync_tied_grads)
      .def("sync_tied_embedding_shard", &pp::PipelineRuntime::sync_tied_embedding_shard, "ddp"_a,
           nogil())
      .def_property_readonly("timeline",
                             [](const pp::PipelineRuntime& r) { return timed_list(r.timeline()); })
      .def_property_readonly("last_stats",
                             [](const pp::PipelineRuntime& r) {
                               const pp::PipelineStepStats& s = r.last_stats();
                               py::dict d;
                               d["step_s"] = s.step_s;
                               d["busy_s"] = s.busy_s;
                               d["bubble_fraction"] = s.bubble_fraction;
                               return d;
                             })
      .def("gather_timelines",
           [](pp::PipelineRuntime& r) {
             std::vector<std::vector<pp::TimedAction>> tl;
             {
               py::gil_scoped_release unlocked;
               tl = r.gather_timelines();
             }
             return timed_lists(tl);
           })
      .def_property_readonly("pp", &pp::PipelineRuntime::pp)
      .def_property_readonly("rank", &pp::PipelineRuntime::rank)
      .def_property_readonly("vpp", &pp::PipelineRuntime::vpp)
      .def_property_readonly("microbatches", &pp::PipelineRuntime::microbatches)
      .def_property_readonly("kind",
                             [](const pp::PipelineRuntime& r) { return pp::to_string(r.kind()); })
      .def_property_readonly("schedule", &pp::PipelineRuntime::schedule)
      .def_property_readonly("pp_group", &pp::PipelineRuntime::pp_group)
      .def_property_readonly("embedding_group", &pp::PipelineRuntime::embedding_group)
      .def_property_readonly("activation_shape", &pp::PipelineRuntime::activation_shape)
      .def_property_readonly("activation_dtype", &pp::PipelineRuntime::activation_dtype)
      .def_property_readonly("activation_device", &pp::PipelineRuntime::activation_device);
}

}  // namespace td::python
