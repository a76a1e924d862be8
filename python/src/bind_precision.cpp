// Per-linear precision of the fused GPT (models/precision_policy.h, models/block_linears.h) and
// its once-per-step synchronization (parallel/precision_sync.h): tardelli._C.models
// .PrecisionPolicy / parse_precision_map, the GPT's block-linear methods, and
// tardelli._C.parallel.precision_step / sync_fp8_amaxes. Type conversion only; the trainer
// (td::train::BlockPrecision, include/tardelli/train/train_precision.h) drives them.
#include "bind.h"
#include "tardelli/models/gpt.h"
#include "tardelli/models/precision_policy.h"
#include "tardelli/parallel/precision_sync.h"

namespace td::python {

using namespace pybind11::literals;
using models::GPT;
using models::LinearPrecision;
using models::PrecisionPolicy;

namespace {

std::vector<std::string> names_of(const std::vector<LinearPrecision>& ps) {
  std::vector<std::string> out;
  for (LinearPrecision p : ps) out.emplace_back(models::precision_name(p));
  return out;
}

std::vector<LinearPrecision> parse_all(const std::vector<std::string>& ps, const char* what) {
  std::vector<LinearPrecision> out;
  for (const auto& p : ps) {
    out.push_back(p == "default" ? LinearPrecision::Default : models::parse_precision(p, what));
  }
  return out;
}

py::list changes_list(const std::vector<models::PrecisionChange>& cs) {
  py::list out;
  for (const auto& c : cs) {
    out.append(
        py::make_tuple(c.name, models::precision_name(c.from), models::precision_name(c.to)));
  }
  return out;
}

}  // namespace

void init_precision(py::module_& m, TensorClass& /*cls*/) {
  py::module_ mm = m.attr("models").cast<py::module_>();
  py::module_ pm = m.attr("parallel").cast<py::module_>();

  mm.def(
      "parse_precision_map",
      [](const std::map<std::string, std::string>& entries, int64_t n_layer) {
        std::map<std::string, std::string> out;
        for (const auto& [k, v] : models::parse_precision_map(entries, n_layer))
          out[k] = models::precision_name(v);
        return out;
      },
      "entries"_a, "n_layer"_a);
  mm.def("block_linear_names", &models::block_linear_names, "first_layer"_a, "num_layers"_a);

  const models::PrecisionPolicyOptions d;
  py::class_<PrecisionPolicy, std::shared_ptr<PrecisionPolicy>>(mm, "PrecisionPolicy")
      .def(py::init([](std::vector<std::string> names, const std::vector<std::string>& floors,
                       double fp8_overflow, double fp8_underflow, double fp8_error,
                       double bf16_error, int64_t stable_steps) {
             models::PrecisionPolicyOptions o;
             o.fp8_overflow = fp8_overflow;
             o.fp8_underflow = fp8_underflow;
             o.fp8_error = fp8_error;
             o.bf16_error = bf16_error;
             o.stable_steps = stable_steps;
             return std::make_shared<PrecisionPolicy>(
                 std::move(names), parse_all(floors, "PrecisionPolicy floor"), o);
           }),
           "names"_a, "floors"_a, "fp8_overflow"_a = d.fp8_overflow,
           "fp8_underflow"_a = d.fp8_underflow, "fp8_error"_a = d.fp8_error,
           "bf16_error"_a = d.bf16_error, "stable_steps"_a = d.stable_steps)
      .def_property_readonly("names", &PrecisionPolicy::names)
      .def_property_readonly("precisions",
                             [](const PrecisionPolicy& p) { return names_of(p.precisions()); })
      .def_property_readonly("floors",
                             [](const PrecisionPolicy& p) { return names_of(p.floors()); })
      .def_property_readonly("stable_counts", &PrecisionPolicy::stable_counts)
      .def(
          "set_state",
          [](PrecisionPolicy& p, const std::string& name, const std::string& precision,
             int64_t stable) {
            p.set_state(name, models::parse_precision(precision, "PrecisionPolicy.set_state"),
                        stable);
          },
          "name"_a, "precision"_a, "stable"_a);

  // The GPT class registered by init_models gets its block-linear methods here.
  auto cls = py::reinterpret_borrow<py::class_<GPT, std::shared_ptr<GPT>>>(mm.attr("GPT"));
  cls.def_property(
         "linear_precisions",
         [](const GPT& g) {
           std::vector<std::string> out;
           for (size_t i = 0; i < g.block_linears().size(); ++i)
             out.emplace_back(models::precision_name(g.block_linears().precision(i)));
           return out;
         },
         [](GPT& g, const std::vector<std::string>& ps) {
           g.block_linears().set_precisions(parse_all(ps, "GPT.linear_precisions"));
         })
      .def_property(
          "precision_monitor", [](const GPT& g) { return g.block_linears().monitor(); },
          [](GPT& g, bool on) { g.block_linears().set_monitor(on); })
      .def("linear_stats", [](const GPT& g) {
        py::list out;
        for (const auto& s : g.block_linears().stats()) {
          py::dict d;
          d["fp8_values"] = s.fp8.values;
          d["fp8_overflow"] = s.fp8.overflow;
          d["fp8_underflow"] = s.fp8.underflow;
          d["fp8_error"] = s.fp8_error;
          d["bf16_error"] = s.bf16_error;
          d["nonfinite"] = s.nonfinite;
          out.append(d);
        }
        return out;
      });

  pm.def(
      "precision_step",
      [](const std::shared_ptr<GPT>& model, const std::shared_ptr<PrecisionPolicy>& policy,
         const distributed::CommPtr& group) {
        std::vector<models::PrecisionChange> cs;
        {
          py::gil_scoped_release release;
          cs = parallel::precision_step(*model, policy.get(), group);
        }
        return changes_list(cs);
      },
      "model"_a, "policy"_a = nullptr, "group"_a = nullptr);
  pm.def(
      "sync_fp8_amaxes",
      [](const std::shared_ptr<GPT>& model, const distributed::CommPtr& group) {
        parallel::sync_fp8_amaxes(*model, group);
      },
      "model"_a, "group"_a = nullptr, nogil());
}

}  // namespace td::python
