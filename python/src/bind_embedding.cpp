// Embedding lookup and its deterministic backward (ops/embedding.h).
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_embedding(py::module_& m, TensorClass& cls) {
  m.def("embedding", &embedding, "weight"_a, "indices"_a, nogil());
  m.def("embedding_backward", &embedding_backward, "grad"_a, "indices"_a, "num_embeddings"_a,
        nogil());
}

}  // namespace td::python
