// Elementwise arithmetic, comparisons and unary math (ops/elementwise.h), as functions and as
// Tensor methods. Python operators (+, -, ...) are defined in tardelli/_tensor.py on top.
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

namespace {

using Unary = Tensor (*)(const Tensor&);
using Binary = Tensor (*)(const Tensor&, const Tensor&);
using BinaryScalar = Tensor (*)(const Tensor&, double);

// Binds `name` as a function and a method for a tensor or a Python-number second argument.
void def_binary(py::module_& m, TensorClass& cls, const char* name, Binary f, BinaryScalar fs) {
  m.def(name, f, "input"_a, "other"_a, nogil());
  m.def(name, fs, "input"_a, "other"_a, nogil());
  cls.def(name, f, "other"_a, nogil());
  cls.def(name, fs, "other"_a, nogil());
}

void def_unary(py::module_& m, TensorClass& cls, const char* name, Unary f) {
  m.def(name, f, "input"_a, nogil());
  cls.def(name, f, nogil());
}

}  // namespace

void init_elementwise(py::module_& m, TensorClass& cls) {
  // add/sub take alpha (other * alpha) like torch.
  for (auto [name, sign] : {std::pair{"add", 1.0}, std::pair{"sub", -1.0}}) {
    auto tt = [sign](const Tensor& a, const Tensor& b, double alpha) {
      return add(a, b, sign * alpha);
    };
    auto ts = [sign](const Tensor& a, double b, double alpha) { return add(a, sign * alpha * b); };
    m.def(name, tt, "input"_a, "other"_a, py::kw_only(), "alpha"_a = 1.0, nogil());
    m.def(name, ts, "input"_a, "other"_a, py::kw_only(), "alpha"_a = 1.0, nogil());
    cls.def(name, tt, "other"_a, py::kw_only(), "alpha"_a = 1.0, nogil());
    cls.def(name, ts, "other"_a, py::kw_only(), "alpha"_a = 1.0, nogil());
  }
  def_binary(m, cls, "mul", &mul, py::overload_cast<const Tensor&, double>(&mul));
  def_binary(m, cls, "div", &div, py::overload_cast<const Tensor&, double>(&div));
  def_binary(m, cls, "pow", &pow, py::overload_cast<const Tensor&, double>(&pow));
  m.def("rsub", &rsub, "input"_a, "other"_a, nogil());  // other - input
  m.def("rdiv", &rdiv, "input"_a, "other"_a, nogil());  // other / input
  m.def("rpow", &rpow, "input"_a, "base"_a, nogil());   // base ** input
  m.def("maximum", &maximum, "input"_a, "other"_a, nogil());
  m.def("minimum", &minimum, "input"_a, "other"_a, nogil());
  cls.def("maximum", &maximum, "other"_a, nogil());
  cls.def("minimum", &minimum, "other"_a, nogil());
  m.def("clamp", &clamp, "input"_a, "min"_a = py::none(), "max"_a = py::none(), nogil());
  cls.def("clamp", &clamp, "min"_a = py::none(), "max"_a = py::none(), nogil());

  def_unary(m, cls, "neg", &neg);
  def_unary(m, cls, "exp", &exp);
  def_unary(m, cls, "log", &log);
  def_unary(m, cls, "tanh", &tanh);
  def_unary(m, cls, "sqrt", &sqrt);
  def_unary(m, cls, "rsqrt", &rsqrt);
  def_unary(m, cls, "abs", &abs);
  def_unary(m, cls, "sigmoid", &sigmoid);
  def_unary(m, cls, "sin", &sin);
  def_unary(m, cls, "cos", &cos);
  def_unary(m, cls, "logical_not", &logical_not);

  using CmpScalar = Tensor (*)(const Tensor&, double);
  def_binary(m, cls, "eq", py::overload_cast<const Tensor&, const Tensor&>(&eq),
             static_cast<CmpScalar>(&eq));
  def_binary(m, cls, "ne", py::overload_cast<const Tensor&, const Tensor&>(&ne),
             static_cast<CmpScalar>(&ne));
  def_binary(m, cls, "lt", py::overload_cast<const Tensor&, const Tensor&>(&lt),
             static_cast<CmpScalar>(&lt));
  def_binary(m, cls, "le", py::overload_cast<const Tensor&, const Tensor&>(&le),
             static_cast<CmpScalar>(&le));
  def_binary(m, cls, "gt", py::overload_cast<const Tensor&, const Tensor&>(&gt),
             static_cast<CmpScalar>(&gt));
  def_binary(m, cls, "ge", py::overload_cast<const Tensor&, const Tensor&>(&ge),
             static_cast<CmpScalar>(&ge));

  // In place (the library refuses them on tensors that require grad while grad mode is on).
  cls.def(
      "add_",
      [](py::object self, const Tensor& other, double alpha) {
        Tensor& t = self.cast<Tensor&>();
        {
          py::gil_scoped_release unlocked;
          add_(t, other, alpha);
        }
        return self;
      },
      "other"_a, py::kw_only(), "alpha"_a = 1.0);
  cls.def(
      "add_",
      [](py::object self, double other, double alpha) {
        Tensor& t = self.cast<Tensor&>();
        {
          py::gil_scoped_release unlocked;
          add_(t, scalar_tensor(other * alpha, DType::Float32), 1.0);
        }
        return self;
      },
      "other"_a, py::kw_only(), "alpha"_a = 1.0);
  cls.def(
      "sub_",
      [](py::object self, const Tensor& other, double alpha) {
        Tensor& t = self.cast<Tensor&>();
        {
          py::gil_scoped_release unlocked;
          add_(t, other, -alpha);
        }
        return self;
      },
      "other"_a, py::kw_only(), "alpha"_a = 1.0);
  cls.def(
      "mul_",
      [](py::object self, double other) {
        Tensor& t = self.cast<Tensor&>();
        {
          py::gil_scoped_release unlocked;
          mul_(t, other);
        }
        return self;
      },
      "other"_a);
  m.def("sum_to", &sum_to, "grad"_a, "shape"_a, nogil());
}

}  // namespace td::python
