// Masking, selection and triangles (ops/indexing.h). Python scalars for where() are turned
// into tensors in tardelli/__init__.py.
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_indexing(py::module_& m, TensorClass& cls) {
  m.def("masked_fill", &masked_fill, "input"_a, "mask"_a, "value"_a, nogil());
  cls.def("masked_fill", &masked_fill, "mask"_a, "value"_a, nogil());
  m.def("_where", &where, "condition"_a, "input"_a, "other"_a, nogil());
  m.def("tril", &tril, "input"_a, "diagonal"_a = 0, nogil());
  m.def("triu", &triu, "input"_a, "diagonal"_a = 0, nogil());
  cls.def("tril", &tril, "diagonal"_a = 0, nogil());
  cls.def("triu", &triu, "diagonal"_a = 0, nogil());
  m.def("index_select", &index_select, "input"_a, "dim"_a, "index"_a, nogil());
  cls.def("index_select", &index_select, "dim"_a, "index"_a, nogil());
  m.def("index_add", &index_add, "input"_a, "dim"_a, "index"_a, "source"_a, nogil());
  cls.def("index_add", &index_add, "dim"_a, "index"_a, "source"_a, nogil());
}

}  // namespace td::python
