// Dropout (ops/dropout.h). The mask is regenerated from a Philox state, see core/rng.h.
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_dropout(py::module_& m, TensorClass& cls) {
  m.def("dropout", &dropout, "input"_a, "p"_a = 0.5, "training"_a = true, "generator"_a = nullptr,
        nogil());
  m.def("dropout_apply", &dropout_apply, "input"_a, "p"_a, "state"_a, nogil());
}

}  // namespace td::python
