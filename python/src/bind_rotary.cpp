// Rotary position embedding (ops/rotary.h).
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_rotary(py::module_& m, TensorClass& cls) {
  m.def("rope_cache", &rope_cache, "seq_len"_a, "head_dim"_a, "base"_a = 10000.0, "start_pos"_a = 0,
        nogil());
  m.def("apply_rotary", &apply_rotary, "input"_a, "cos"_a, "sin"_a, nogil());
  m.def("rotary_kernel", &rotary_kernel, "input"_a, "cos"_a, "sin"_a, "inverse"_a, nogil());
}

}  // namespace td::python
