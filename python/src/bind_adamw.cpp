// The fused AdamW update (ops/adamw.h), for one tensor or a list of tensors; in place.
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_adamw(py::module_& m, TensorClass& cls) {
  m.def(
      "adamw_step",
      [](Tensor param, const Tensor& grad, Tensor exp_avg, Tensor exp_avg_sq, double lr,
         double beta1, double beta2, double eps, double weight_decay, int64_t step) {
        py::gil_scoped_release unlocked;
        adamw_step(param, grad, exp_avg, exp_avg_sq,
                   AdamWConfig{lr, beta1, beta2, eps, weight_decay, step});
      },
      "param"_a, "grad"_a, "exp_avg"_a, "exp_avg_sq"_a, py::kw_only(), "lr"_a = 1e-3,
      "beta1"_a = 0.9, "beta2"_a = 0.999, "eps"_a = 1e-8, "weight_decay"_a = 0.01, "step"_a = 1);
  m.def(
      "adamw_step",
      [](TensorList params, const TensorList& grads, TensorList exp_avgs, TensorList exp_avg_sqs,
         double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
        py::gil_scoped_release unlocked;
        adamw_step(params, grads, exp_avgs, exp_avg_sqs,
                   AdamWConfig{lr, beta1, beta2, eps, weight_decay, step});
      },
      "params"_a, "grads"_a, "exp_avgs"_a, "exp_avg_sqs"_a, py::kw_only(), "lr"_a = 1e-3,
      "beta1"_a = 0.9, "beta2"_a = 0.999, "eps"_a = 1e-8, "weight_decay"_a = 0.01, "step"_a = 1);
  m.def(
      "adamw_step_capturable",
      [](TensorList params, const TensorList& grads, TensorList exp_avgs, TensorList exp_avg_sqs,
         const Tensor& lr, Tensor step, double beta1, double beta2, double eps,
         double weight_decay) {
        py::gil_scoped_release unlocked;
        adamw_step_capturable(params, grads, exp_avgs, exp_avg_sqs, lr, step, beta1, beta2, eps,
                              weight_decay);
      },
      "params"_a, "grads"_a, "exp_avgs"_a, "exp_avg_sqs"_a, py::kw_only(), "lr"_a, "step"_a,
      "beta1"_a = 0.9, "beta2"_a = 0.999, "eps"_a = 1e-8, "weight_decay"_a = 0.01);
}

}  // namespace td::python
