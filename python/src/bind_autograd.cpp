// Autograd: grad mode, backward / grad, graph nodes, hooks taking Python callables, gradcheck.
// backward runs with the GIL released; a Python hook takes it back for its own call (see
// PyCallable), so other Python threads run while the graph executes.
#include "bind.h"
#include "tardelli/autograd/checkpoint.h"
#include "tardelli/autograd/weight_grad_store.h"

namespace td::python {

using namespace pybind11::literals;

namespace {

Tensor::Hook python_hook(py::function fn) {
  return [f = PyCallable(std::move(fn))](const Tensor& g) -> std::optional<Tensor> {
    py::gil_scoped_acquire gil;
    py::object r = f(py::make_tuple(g));
    if (r.is_none()) return std::nullopt;
    return r.cast<Tensor>();
  };
}

}  // namespace

void init_autograd(py::module_& m, TensorClass& cls) {
  m.def("is_grad_enabled", &autograd::grad_enabled);
  m.def("set_grad_enabled", &autograd::set_grad_enabled, "mode"_a);

  py::class_<autograd::Node, std::shared_ptr<autograd::Node>>(m, "Node")
      .def("name", &autograd::Node::name)
      .def_property_readonly(
          "next_functions",
          [](const autograd::Node& n) {
            py::list r;
            for (const auto& e : n.next_edges()) {
              r.append(py::make_tuple(e.fn ? py::cast(e.fn) : py::none(), e.input_nr));
            }
            return py::tuple(r);
          })
      .def("__repr__", [](const autograd::Node& n) { return "<" + n.name() + " object>"; });

  cls.def_property("requires_grad", &Tensor::requires_grad,
                   [](Tensor& t, bool r) { t.set_requires_grad(r); })
      .def(
          "requires_grad_",
          [](py::object self, bool r) {
            self.cast<Tensor&>().set_requires_grad(r);
            return self;
          },
          "requires_grad"_a = true)
      .def_property(
          "grad", [](const Tensor& t) { return or_none(t.grad()); },
          [](const Tensor& t, const std::optional<Tensor>& g) { t.set_grad(or_undefined(g)); })
      .def_property_readonly("grad_fn", &Tensor::grad_fn)
      .def_property_readonly("is_leaf", &Tensor::is_leaf)
      .def_property_readonly("retains_grad",
                             [](const Tensor& t) {
                               auto* meta = autograd::meta_of(t);
                               return meta != nullptr && meta->retains_grad;
                             })
      .def_property_readonly("output_nr", &Tensor::output_nr)
      .def_property("data", &Tensor::detach,
                    [](const Tensor& t, const Tensor& src) {
                      // torch's `t.data = src`: t (every handle to it) now views src's memory,
                      // keeping its own autograd state.
                      TensorImpl* impl = t.impl();
                      impl->storage = src.storage();
                      impl->sizes = src.sizes();
                      impl->strides = src.strides();
                      impl->offset = src.storage_offset();
                      impl->dtype = src.dtype();
                    })
      .def("detach", &Tensor::detach)
      .def(
          "backward",
          [](const Tensor& t, const std::optional<Tensor>& gradient,
             std::optional<bool> retain_graph, bool create_graph) {
            py::gil_scoped_release unlocked;
            t.backward(or_undefined(gradient), retain_graph.value_or(create_graph), create_graph);
          },
          "gradient"_a = py::none(), "retain_graph"_a = py::none(), "create_graph"_a = false)
      .def(
          "register_hook",
          [](const Tensor& t, py::function fn) { t.register_hook(python_hook(std::move(fn))); },
          "hook"_a)
      .def(
          "register_post_accumulate_grad_hook",
          [](const Tensor& t, py::function fn) {
            t.register_post_accumulate_grad_hook(
                [f = PyCallable(std::move(fn))](const Tensor& leaf) {
                  py::gil_scoped_acquire gil;
                  f(py::make_tuple(leaf));
                });
          },
          "hook"_a)
      .def("retain_grad", &Tensor::retain_grad);

  py::class_<autograd::DeferredWeightGrads>(
      m, "DeferredWeightGrads", "Weight gradients left by backward_input (zero-bubble pipelines)")
      .def("run", &autograd::DeferredWeightGrads::run, nogil())
      .def("__len__", &autograd::DeferredWeightGrads::size);
  m.def(
      "backward_input",
      [](const TensorList& roots, const std::vector<std::optional<Tensor>>& grads) {
        TensorList g = or_undefined(grads);
        py::gil_scoped_release unlocked;
        return autograd::backward_input(roots, g);
      },
      "roots"_a, "grads"_a);
  // fn takes and returns a list of tensors (td.utils.checkpoint wraps any signature). It runs
  // here with the GIL held, and again in backward from the engine (GIL released), taking it back.
  m.def(
      "autograd_checkpoint",
      [](py::function fn, const TensorList& inputs, const std::vector<Generator*>& generators) {
        PyCallable f(std::move(fn));
        autograd::CheckpointOptions opts;
        opts.generators = generators;
        return autograd::checkpoint(
            [f](const TensorList& xs) {
              py::gil_scoped_acquire gil;
              return f(py::make_tuple(xs)).cast<TensorList>();
            },
            inputs, opts);
      },
      "fn"_a, "inputs"_a, "generators"_a);
  m.def(
      "backward",
      [](const TensorList& roots, const std::vector<std::optional<Tensor>>& grads,
         bool retain_graph, bool create_graph) {
        TensorList g = or_undefined(grads);
        py::gil_scoped_release unlocked;
        autograd::backward(roots, g, retain_graph, create_graph);
      },
      "tensors"_a, "grad_tensors"_a, "retain_graph"_a, "create_graph"_a);
  m.def(
      "grad",
      [](const TensorList& roots, const TensorList& inputs,
         const std::vector<std::optional<Tensor>>& grads, bool retain_graph, bool create_graph,
         bool allow_unused) {
        TensorList g = or_undefined(grads);
        TensorList r;
        {
          py::gil_scoped_release unlocked;
          r = autograd::grad(roots, inputs, g, retain_graph, create_graph, allow_unused);
        }
        return or_none(r);
      },
      "outputs"_a, "inputs"_a, "grad_outputs"_a, "retain_graph"_a, "create_graph"_a,
      "allow_unused"_a);
  m.def(
      "gradcheck",
      [](py::function fn, const TensorList& inputs, double eps, double atol, double rtol,
         uint64_t seed) {
        PyCallable f(std::move(fn));
        auto call = [&f](const TensorList& xs) {
          py::gil_scoped_acquire gil;
          return f(py::make_tuple(xs)).cast<Tensor>();
        };
        autograd::GradcheckResult r;
        {
          py::gil_scoped_release unlocked;
          r = autograd::gradcheck(call, inputs, {eps, atol, rtol, seed});
        }
        return py::make_tuple(r.ok, r.max_abs_err, r.message);
      },
      "fn"_a, "inputs"_a, "eps"_a, "atol"_a, "rtol"_a, "seed"_a);
}

}  // namespace td::python
