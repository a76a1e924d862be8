// Activations and their fused backward kernels (ops/activation.h).
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_activation(py::module_& m, TensorClass& cls) {
  auto gelu_fn = [](const Tensor& x, const std::string& approximate) {
    GeluApprox a = parse_gelu_approx(approximate);
    py::gil_scoped_release unlocked;
    return gelu(x, a);
  };
  m.def("gelu", gelu_fn, "input"_a, "approximate"_a = "none");
  m.def(
      "gelu_backward",
      [](const Tensor& g, const Tensor& x, const std::string& approximate) {
        GeluApprox a = parse_gelu_approx(approximate);
        py::gil_scoped_release unlocked;
        return gelu_backward(g, x, a);
      },
      "grad"_a, "input"_a, "approximate"_a = "none");
  m.def("silu", &silu, "input"_a, nogil());
  m.def("silu_backward", &silu_backward, "grad"_a, "input"_a, nogil());
  m.def("relu", &relu, "input"_a, nogil());
  m.def("relu_backward", &relu_backward, "grad"_a, "result"_a, nogil());
  cls.def("relu", &relu, nogil());
}

}  // namespace td::python
