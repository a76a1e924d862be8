#pragma once
// Shared pieces of the Python binding (internal). Note [Binding layer]: the files in python/src
// only convert types between Python and td:: (shapes, optional tensors, dtypes, callables) and
// release the GIL around library calls; every behaviour lives in the C++ library or, for
// torch-style sugar, in python/tardelli/*.py.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "tardelli/parallel/pipeline_schedule.h"
#include "tardelli/tardelli.h"

namespace td::python {

namespace py = pybind11;

using TensorClass = py::class_<Tensor>;
// Releases the GIL for a call that cannot run Python code.
using nogil = py::call_guard<py::gil_scoped_release>;

// A pipeline timeline per rank as Python tuples (kind code, micro-batch, chunk, start, end)
// (bind_pipeline.cpp).
using TimedTuple = std::tuple<std::string, int, int, double, double>;
std::vector<std::vector<TimedTuple>> timed_lists(
    const std::vector<std::vector<parallel::TimedAction>>& tl);

// None <-> undefined tensor, for optional arguments and results.
inline Tensor or_undefined(const std::optional<Tensor>& t) {
  return t ? *t : Tensor();
}
inline std::optional<Tensor> or_none(const Tensor& t) {
  return t.defined() ? std::optional<Tensor>(t) : std::nullopt;
}
inline std::vector<std::optional<Tensor>> or_none(const TensorList& ts) {
  std::vector<std::optional<Tensor>> r;
  r.reserve(ts.size());
  for (const auto& t : ts) r.push_back(or_none(t));
  return r;
}
inline TensorList or_undefined(const std::vector<std::optional<Tensor>>& ts) {
  TensorList r;
  r.reserve(ts.size());
  for (const auto& t : ts) r.push_back(or_undefined(t));
  return r;
}

// torch-style size arguments: f(2, 3) or f((2, 3)) or f([2, 3]).
Shape shape_from_args(const py::args& args);
// A dims argument that is an int, a sequence of ints or None (empty: all dims).
Shape dims_from_object(const py::object& dims);

// A Python callable that may be copied, called and destroyed from any thread: each call and the
// final release take the GIL. Used for hooks that live inside the autograd graph.
class PyCallable {
 public:
  explicit PyCallable(py::function f);
  py::object operator()(const py::tuple& args) const;

 private:
  std::shared_ptr<py::function> fn_;
};

void init_core(py::module_& m, TensorClass& cls);
void init_autograd(py::module_& m, TensorClass& cls);
void init_elementwise(py::module_& m, TensorClass& cls);
void init_reduction(py::module_& m, TensorClass& cls);
void init_activation(py::module_& m, TensorClass& cls);
void init_softmax(py::module_& m, TensorClass& cls);
void init_norm(py::module_& m, TensorClass& cls);
void init_loss(py::module_& m, TensorClass& cls);
void init_embedding(py::module_& m, TensorClass& cls);
void init_rotary(py::module_& m, TensorClass& cls);
void init_adamw(py::module_& m, TensorClass& cls);
void init_loss_scaler(py::module_& m, TensorClass& cls);
void init_matmul(py::module_& m, TensorClass& cls);
void init_attention(py::module_& m, TensorClass& cls);
void init_indexing(py::module_& m, TensorClass& cls);
void init_join(py::module_& m, TensorClass& cls);
void init_dropout(py::module_& m, TensorClass& cls);
void init_models(py::module_& m, TensorClass& cls);
void init_hf(py::module_& m, TensorClass& cls);  // after init_models
void init_data(py::module_& m, TensorClass& cls);
void init_checkpoint(py::module_& m, TensorClass& cls);  // after init_models
void init_distributed(py::module_& m, TensorClass& cls);
void init_data_parallel(py::module_& m, TensorClass& cls);  // after init_distributed
void init_parallel(py::module_& m, TensorClass& cls);       // after init_distributed
void init_gpt_parallel(py::module_& m, TensorClass& cls);   // after init_parallel, init_models
void init_pipeline(py::module_& m, TensorClass& cls);
void init_precision(py::module_& m, TensorClass& cls);  // after init_gpt_parallel
void init_train(py::module_& m, TensorClass& cls);      // after init_distributed

}  // namespace td::python
