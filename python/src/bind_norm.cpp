// Fused layer norm and RMS norm with their kernels (ops/norm.h). normalized_shape is an int or a
// sequence of ints; forward kernels return (y, mean, rstd) with None for what is not computed.
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

namespace {

using OptTensor = std::optional<Tensor>;

py::tuple norm_tuple(const NormForward& f) {
  return py::make_tuple(or_none(f.y), or_none(f.mean), or_none(f.rstd));
}

}  // namespace

void init_norm(py::module_& m, TensorClass& cls) {
  m.def(
      "layer_norm",
      [](const Tensor& x, const py::object& normalized_shape, const OptTensor& w,
         const OptTensor& b, double eps) {
        Shape ns = dims_from_object(normalized_shape);
        py::gil_scoped_release unlocked;
        return layer_norm(x, ns, or_undefined(w), or_undefined(b), eps);
      },
      "input"_a, "normalized_shape"_a, "weight"_a = py::none(), "bias"_a = py::none(),
      "eps"_a = 1e-5);
  m.def(
      "rms_norm",
      [](const Tensor& x, const py::object& normalized_shape, const OptTensor& w, double eps) {
        Shape ns = dims_from_object(normalized_shape);
        py::gil_scoped_release unlocked;
        return rms_norm(x, ns, or_undefined(w), eps);
      },
      "input"_a, "normalized_shape"_a, "weight"_a = py::none(), "eps"_a = 1e-6);
  m.def(
      "layer_norm_forward",
      [](const Tensor& x, int64_t norm_numel, const OptTensor& w, const OptTensor& b, double eps) {
        NormForward f;
        {
          py::gil_scoped_release unlocked;
          f = layer_norm_forward(x, norm_numel, or_undefined(w), or_undefined(b), eps);
        }
        return norm_tuple(f);
      },
      "input"_a, "norm_numel"_a, "weight"_a = py::none(), "bias"_a = py::none(), "eps"_a = 1e-5);
  m.def(
      "layer_norm_backward",
      [](const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
         const OptTensor& w, bool has_bias, int64_t norm_numel) {
        std::tuple<Tensor, Tensor, Tensor> r;
        {
          py::gil_scoped_release unlocked;
          r = layer_norm_backward(g, x, mean, rstd, or_undefined(w), has_bias, norm_numel);
        }
        return py::make_tuple(or_none(std::get<0>(r)), or_none(std::get<1>(r)),
                              or_none(std::get<2>(r)));
      },
      "grad"_a, "input"_a, "mean"_a, "rstd"_a, "weight"_a, "has_bias"_a, "norm_numel"_a);
  m.def(
      "rms_norm_forward",
      [](const Tensor& x, int64_t norm_numel, const OptTensor& w, double eps) {
        NormForward f;
        {
          py::gil_scoped_release unlocked;
          f = rms_norm_forward(x, norm_numel, or_undefined(w), eps);
        }
        return norm_tuple(f);
      },
      "input"_a, "norm_numel"_a, "weight"_a = py::none(), "eps"_a = 1e-6);
  m.def(
      "rms_norm_backward",
      [](const Tensor& g, const Tensor& x, const Tensor& rstd, const OptTensor& w,
         int64_t norm_numel) {
        std::pair<Tensor, Tensor> r;
        {
          py::gil_scoped_release unlocked;
          r = rms_norm_backward(g, x, rstd, or_undefined(w), norm_numel);
        }
        return py::make_tuple(or_none(r.first), or_none(r.second));
      },
      "grad"_a, "input"_a, "rstd"_a, "weight"_a, "norm_numel"_a);
}

}  // namespace td::python
