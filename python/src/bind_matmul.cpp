// Matrix products (ops/matmul.h).
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_matmul(py::module_& m, TensorClass& cls) {
  m.def("matmul", &matmul, "input"_a, "other"_a, nogil());
  m.def("mm", &mm, "input"_a, "mat2"_a, nogil());
  m.def("bmm", &bmm, "input"_a, "mat2"_a, nogil());
  m.def(
      "linear",
      [](const Tensor& x, const Tensor& w, const std::optional<Tensor>& b) {
        Tensor bias = or_undefined(b);
        py::gil_scoped_release unlocked;
        return linear(x, w, bias);
      },
      "input"_a, "weight"_a, "bias"_a = py::none());
  m.def("set_matmul_allow_tf32", &set_matmul_allow_tf32, "allow"_a);
  m.def("matmul_allow_tf32", &matmul_allow_tf32);
  m.def("cpu_matmul_kernel", &cpu_matmul_kernel, "dtype"_a);
  m.def("cpu_isa", &cpu_isa);
  cls.def("matmul", &matmul, "other"_a, nogil());
  cls.def("mm", &mm, "mat2"_a, nogil());
  cls.def("bmm", &bmm, "mat2"_a, nogil());
}

}  // namespace td::python
