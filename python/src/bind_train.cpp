// The C++ training loop (include/tardelli/train/trainer.h) as tardelli._C.train: the Trainer
// that python -m tardelli.train and python -m tardelli.checkpoint convert drive. Type conversion
// only: configurations, summaries and records cross as JSON text (the Python side's json module
// reads and writes them), callbacks are called with the GIL held.
#include "bind.h"
#include "tardelli/core/json.h"
#include "tardelli/train/metrics_file.h"
#include "tardelli/train/train_config.h"
#include "tardelli/train/trainer.h"

namespace td::python {

using namespace pybind11::literals;
using train::Trainer;

void init_train(py::module_& m, TensorClass& /*cls*/) {
  py::module_ t = m.def_submodule("train", "The C++ training loop (include/tardelli/train)");
  // A bad configuration (every rank rejects it alike): the Python CLI exits with status 2.
  py::register_exception<train::ConfigError>(t, "ConfigError", PyExc_ValueError);

  t.def(
      "fields_json", [] { return json::dump(train::fields_json()); },
      "Every configuration field (name, type, default, help, choices) as JSON text");
  t.def(
      "gemm_peak_flops",
      [](const std::string& dtype, const std::string& device, int64_t n, int reps) {
        return train::gemm_peak_flops(checkpoint::parse_short_dtype(dtype), Device::parse(device),
                                      n, reps);
      },
      "dtype"_a, "device"_a = "cpu", "n"_a = 0, "reps"_a = 5, nogil());

  py::class_<Trainer>(t, "Trainer")
      .def(py::init([](const std::string& config_json, const distributed::CommPtr& world,
                       std::optional<int64_t> checkpoint_vocab, const std::string& tokenizer_dir) {
             train::TrainConfig cfg = train::from_json(json::parse(config_json), "config");
             std::optional<train::CheckpointOnly> only;
             if (checkpoint_vocab) only = train::CheckpointOnly{*checkpoint_vocab, tokenizer_dir};
             return std::make_unique<Trainer>(std::move(cfg), world, std::move(only));
           }),
           "config_json"_a, "world"_a = nullptr, "checkpoint_vocab"_a = std::nullopt,
           "tokenizer_dir"_a = "", nogil())
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
