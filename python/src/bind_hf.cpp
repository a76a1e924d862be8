// tardelli._C.io (safetensors) and the HF GPT-2 functions of tardelli._C.models
// (checkpoint/safetensors.h, models/hf_gpt2.h). Type conversion only; the Python API is
// python/tardelli/io.py and python/tardelli/models_hf.py.
#include "bind.h"
#include "tardelli/checkpoint/safetensors.h"
#include "tardelli/models/hf_gpt2.h"

namespace td::python {

using namespace pybind11::literals;

namespace {

py::dict to_dict(const std::map<std::string, Tensor>& sd) {
  py::dict r;
  for (const auto& [n, t] : sd) r[py::str(n)] = t;
  return r;
}

}  // namespace

void init_hf(py::module_& m, TensorClass& /*cls*/) {
  py::module_ io = m.def_submodule("io", "safetensors files (C++)");
  io.def(
      "load_safetensors",
      [](const std::string& path) {
        checkpoint::SafetensorsFile f;
        {
          py::gil_scoped_release release;
          f = checkpoint::load_safetensors(path);
        }
        return py::make_tuple(py::cast(f.tensors), py::cast(f.metadata));
      },
      "path"_a, "(tensors as [(name, tensor)] in file order, metadata dict)");
  io.def(
      "save_safetensors",
      [](const checkpoint::NamedTensors& tensors, const std::string& path,
         const std::map<std::string, std::string>& metadata) {
        checkpoint::save_safetensors(path, tensors, metadata);
      },
      "tensors"_a, "path"_a, "metadata"_a = std::map<std::string, std::string>{}, nogil());

  // Requires init_models to have run (the GPT and GPTConfig classes live there).
  py::module_ mm = m.attr("models");
  mm.def(
      "load_hf_gpt2",
      [](const std::string& dir) {
        models::HFGPT2Checkpoint ck;
        {
          py::gil_scoped_release release;
          ck = models::load_hf_gpt2(dir);
        }
        return py::make_tuple(ck.config, to_dict(ck.state_dict));
      },
      "dir"_a, "(GPTConfig, state dict with our names; lm_head.weight is wte.weight)");
  mm.def(
      "save_hf_gpt2",
      [](const std::string& dir, const models::GPTConfig& config,
         const std::map<std::string, Tensor>& state_dict) {
        models::save_hf_gpt2(dir, config, state_dict);
      },
      "dir"_a, "config"_a, "state_dict"_a, nogil());
  mm.def("gpt_from_hf", &models::gpt_from_hf, "dir"_a, "dtype"_a = DType::Float32, nogil());
  mm.def("gpt_to_hf", &models::gpt_to_hf, "model"_a, "dir"_a, nogil());
}

}  // namespace td::python
