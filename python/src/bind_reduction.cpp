// Reductions (ops/reduction.h). A dims argument is an int, a sequence of ints or None (all dims).
// The (values, indices) pair of max along a dim becomes a named tuple in tardelli/_tensor.py.
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

namespace {

using DimsReduction = Tensor (*)(const Tensor&, const Shape&, bool);

// A reduction over dims (sum, mean, amax, all, any): the dim argument converted, the op run
// without the GIL.
template <DimsReduction F>
Tensor over_dims(const Tensor& x, const py::object& dim, bool keepdim) {
  Shape dims = dims_from_object(dim);
  py::gil_scoped_release unlocked;
  return F(x, dims, keepdim);
}

// As td.NAME(input, dim=None, keepdim=False) and Tensor.NAME(dim=None, keepdim=False).
template <DimsReduction F>
void def_over_dims(py::module_& m, TensorClass& cls, const char* name) {
  m.def(name, &over_dims<F>, "input"_a, "dim"_a = py::none(), "keepdim"_a = false);
  cls.def(name, &over_dims<F>, "dim"_a = py::none(), "keepdim"_a = false);
}

}  // namespace

void init_reduction(py::module_& m, TensorClass& cls) {
  def_over_dims<sum>(m, cls, "sum");
  def_over_dims<mean>(m, cls, "mean");

  auto max_all = [](const Tensor& x) { return max(x); };
  auto min_all = [](const Tensor& x) { return min(x); };
  auto max_dim = [](const Tensor& x, int64_t dim, bool keepdim) {
    auto [v, i] = max(x, dim, keepdim);
    return std::make_tuple(v, i);
  };
  auto var_fn = [](const Tensor& x, const py::object& dim, std::optional<bool> unbiased,
                   bool keepdim, std::optional<int64_t> correction) {
    Shape dims = dims_from_object(dim);
    int64_t c = correction ? *correction : (unbiased.value_or(true) ? 1 : 0);
    py::gil_scoped_release unlocked;
    return var(x, dims, c, keepdim);
  };
  m.def("_max_all", max_all, "input"_a, nogil());
  m.def("_min_all", min_all, "input"_a, nogil());
  m.def("_max_dim", max_dim, "input"_a, "dim"_a, "keepdim"_a = false, nogil());
  m.def("argmax", &argmax, "input"_a, "dim"_a = py::none(), "keepdim"_a = false, nogil());
  cls.def("argmax", &argmax, "dim"_a = py::none(), "keepdim"_a = false, nogil());
  def_over_dims<all>(m, cls, "all");
  def_over_dims<any>(m, cls, "any");
  def_over_dims<amax>(m, cls, "amax");
  m.def("var", var_fn, "input"_a, "dim"_a = py::none(), "unbiased"_a = py::none(),
        "keepdim"_a = false, py::kw_only(), "correction"_a = py::none());
  cls.def("var", var_fn, "dim"_a = py::none(), "unbiased"_a = py::none(), "keepdim"_a = false,
          py::kw_only(), "correction"_a = py::none());
  m.def("norm", py::overload_cast<const Tensor&>(&norm), "input"_a, nogil());
  cls.def("norm", py::overload_cast<const Tensor&>(&norm), nogil());
}

}  // namespace td::python
