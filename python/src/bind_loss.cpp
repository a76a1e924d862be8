// Fused cross entropy (ops/loss.h); reduction is 'none' | 'mean' | 'sum' as in torch.
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

namespace {

Reduction parse_reduction(const std::string& s) {
  if (s == "none") return Reduction::None;
  if (s == "mean") return Reduction::Mean;
  if (s == "sum") return Reduction::Sum;
  throw py::value_error("cross_entropy: reduction must be 'none', 'mean' or 'sum', got '" + s +
                        "'");
}

}  // namespace

void init_loss(py::module_& m, TensorClass& cls) {
  m.def(
      "cross_entropy",
      [](const Tensor& logits, const Tensor& target, int64_t ignore_index,
         const std::string& reduction, double label_smoothing) {
        Reduction r = parse_reduction(reduction);
        py::gil_scoped_release unlocked;
        return cross_entropy(logits, target, ignore_index, r, label_smoothing);
      },
      "input"_a, "target"_a, "ignore_index"_a = -100, "reduction"_a = "mean",
      "label_smoothing"_a = 0.0);
}

}  // namespace td::python
