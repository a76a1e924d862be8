// The C++ training loop (include/tardelli/train/trainer.h) as tardelli._C.train: the Trainer
// that python -m tardelli.train and python -m tardelli.checkpoint convert drive, and the
// configuration rules (validate) that the Python front end and the planner apply. Type
// conversion only: a configuration is a flat dict of scalars (as TrainConfig.to_dict() gives),
// summaries cross as JSON text, callbacks are called with the GIL held.
#include "bind.h"
#include "tardelli/core/json.h"
#include "tardelli/train/metrics_file.h"
#include "tardelli/train/train_config.h"
#include "tardelli/train/trainer.h"

namespace td::python {

using namespace pybind11::literals;
using train::Trainer;

namespace {

// A configuration dict (field name -> bool, int, float or str) as the JSON object from_json
// reads; any other value is a ConfigError naming the key.
train::TrainConfig config_of(const py::dict& values) {
  json::Value obj = json::Object{};
  for (const auto& [k, v] : values) {
    const std::string key = py::str(k);
    if (py::isinstance<py::bool_>(v)) {
      obj.set(key, v.cast<bool>());
    } else if (py::isinstance<py::int_>(v)) {
      obj.set(key, v.cast<int64_t>());
    } else if (py::isinstance<py::float_>(v)) {
      obj.set(key, v.cast<double>());
    } else if (py::isinstance<py::str>(v)) {
      obj.set(key, v.cast<std::string>());
    } else {
      throw train::ConfigError("config: '" + key + "' must be a bool, int, float or str, got " +
                               std::string(py::str(py::repr(v))));
    }
  }
  return train::from_json(obj, "config");
}

}  // namespace

void init_train(py::module_& m, TensorClass& /*cls*/) {
  py::module_ t = m.def_submodule("train", "The C++ training loop (include/tardelli/train)");
  // A bad configuration (every rank rejects it alike): the Python CLI exits with status 2.
  py::register_exception<train::ConfigError>(t, "ConfigError", PyExc_ValueError);

  t.def(
      "fields_json", [] { return json::dump(train::fields_json()); },
      "Every configuration field (name, type, default, help, choices) as JSON text");
  t.def(
      "validate",
      [](const py::dict& config, int64_t dp_size) { train::validate(config_of(config), dp_size); },
      "config"_a, "dp_size"_a = 1,
      "td::train::validate: ConfigError naming the offending flag(s) (reads --data's files and "
      "--precision-map)");
  t.def(
      "gemm_peak_flops",
      [](const std::string& dtype, const std::string& device, int64_t n, int reps) {
        return train::gemm_peak_flops(checkpoint::parse_short_dtype(dtype), Device::parse(device),
                                      n, reps);
      },
      "dtype"_a, "device"_a = "cpu", "n"_a = 0, "reps"_a = 5, nogil());

  py::class_<Trainer>(t, "Trainer")
      .def(py::init([](const py::dict& config, const distributed::CommPtr& world,
                       std::optional<int64_t> checkpoint_vocab, const std::string& tokenizer_dir) {
             train::TrainConfig cfg = config_of(config);
             std::optional<train::CheckpointOnly> only;
             if (checkpoint_vocab) only = train::CheckpointOnly{*checkpoint_vocab, tokenizer_dir};
             py::gil_scoped_release release;
             return std::make_unique<Trainer>(std::move(cfg), world, std::move(only));
           }),
           "config"_a, "world"_a = nullptr, "checkpoint_vocab"_a = std::nullopt,
           "tokenizer_dir"_a = "")
      .def(
          "run",
          [](Trainer& tr, const py::function& log, const py::object& on_step) {
            std::function<void(const train::StepRecord&)> step_fn;
            if (!on_step.is_none()) {
              step_fn = [&on_step](const train::StepRecord& r) {
                py::gil_scoped_acquire gil;
                on_step(r.step, r.loss);
              };
            }
            json::Value summary;
            {
              py::gil_scoped_release release;
              summary = tr.run(
                  [&log](const std::string& line) {
                    py::gil_scoped_acquire gil;
                    log(line);
                  },
                  step_fn);
            }
            return train::python_json(summary);
          },
          "log"_a, "on_step"_a = py::none(),
          "Trains to --steps (or --exit-interval); returns the summary as JSON text")
      .def(
          "load_checkpoint",
          [](Trainer& tr, const std::string& path) {
            const train::LoadedState& st = tr.load_checkpoint(path);
            return py::make_tuple(st.path, st.step, st.consumed_samples, st.resharded);
          },
          "path"_a)
      .def("save", &Trainer::save, "root"_a, nogil())
      .def_property_readonly("step", &Trainer::step)
      .def_property_readonly("dp_size", &Trainer::dp_size)
      .def_property_readonly("is_main", &Trainer::is_main)
      .def_property_readonly("num_parameters", &Trainer::num_parameters)
      .def_property_readonly("last_timelines",
                             [](const Trainer& tr) { return timed_lists(tr.last_timelines()); });
}

}  // namespace td::python
