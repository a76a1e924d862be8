// Softmax and log-softmax with their backward kernels (ops/softmax.h).
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_softmax(py::module_& m, TensorClass& cls) {
  m.def("softmax", &softmax, "input"_a, "dim"_a, nogil());
  m.def("log_softmax", &log_softmax, "input"_a, "dim"_a, nogil());
  m.def("softmax_backward", &softmax_backward, "grad"_a, "output"_a, "dim"_a, nogil());
  m.def("log_softmax_backward", &log_softmax_backward, "grad"_a, "output"_a, "dim"_a, nogil());
  cls.def("softmax", &softmax, "dim"_a, nogil());
  cls.def("log_softmax", &log_softmax, "dim"_a, nogil());
}

}  // namespace td::python
