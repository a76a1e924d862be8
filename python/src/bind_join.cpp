// Joining and splitting (ops/join.h).
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_join(py::module_& m, TensorClass& cls) {
  m.def("cat", &cat, "tensors"_a, "dim"_a = 0, nogil());
  m.def("concat", &cat, "tensors"_a, "dim"_a = 0, nogil());
  m.def("stack", &stack, "tensors"_a, "dim"_a = 0, nogil());
  using SplitInt = TensorList (*)(const Tensor&, int64_t, int64_t);
  using SplitSizes = TensorList (*)(const Tensor&, const Shape&, int64_t);
  m.def("split", static_cast<SplitInt>(&split), "tensor"_a, "split_size_or_sections"_a, "dim"_a = 0,
        nogil());
  m.def("split", static_cast<SplitSizes>(&split), "tensor"_a, "split_size_or_sections"_a,
        "dim"_a = 0, nogil());
  cls.def("split", static_cast<SplitInt>(&split), "split_size"_a, "dim"_a = 0, nogil());
  cls.def("split", static_cast<SplitSizes>(&split), "split_size"_a, "dim"_a = 0, nogil());
  m.def("chunk", &chunk, "input"_a, "chunks"_a, "dim"_a = 0, nogil());
  cls.def("chunk", &chunk, "chunks"_a, "dim"_a = 0, nogil());
}

}  // namespace td::python
