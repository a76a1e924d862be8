// Dynamic loss scaling (optim/loss_scaler.h): the trainers' fp16 scaler.
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_loss_scaler(py::module_& m, TensorClass& /*cls*/) {
  py::class_<optim::DynamicLossScaler>(m, "DynamicLossScaler")
      .def(py::init([](double init_scale, double growth_factor, double backoff_factor,
                       int64_t growth_interval) {
             return optim::DynamicLossScaler(
                 {init_scale, growth_factor, backoff_factor, growth_interval});
           }),
           py::kw_only(), "init_scale"_a = 65536.0, "growth_factor"_a = 2.0,
           "backoff_factor"_a = 0.5, "growth_interval"_a = 2000)
      .def_property_readonly("scale", &optim::DynamicLossScaler::scale)
      .def_property_readonly(
          "growth_tracker",
          [](const optim::DynamicLossScaler& s) { return s.state().growth_tracker; })
      .def_property_readonly(
          "skipped_steps",
          [](const optim::DynamicLossScaler& s) { return s.state().skipped_steps; })
      .def("update", &optim::DynamicLossScaler::update, "found_inf"_a)
      .def("state_dict",
           [](const optim::DynamicLossScaler& s) {
             const auto& st = s.state();
             py::dict d;
             d["scale"] = st.scale;
             d["growth_tracker"] = st.growth_tracker;
             d["skipped_steps"] = st.skipped_steps;
             return d;
           })
      .def("load_state_dict", [](optim::DynamicLossScaler& s, const py::dict& d) {
        s.load_state({d["scale"].cast<double>(), d["growth_tracker"].cast<int64_t>(),
                      d["skipped_steps"].cast<int64_t>()});
      });
  m.def("unscale_clip_factor", &optim::unscale_clip_factor, "scaled_norm"_a, "scale"_a,
        "max_norm"_a);
}

}  // namespace td::python
