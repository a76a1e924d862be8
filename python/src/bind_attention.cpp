// Scaled dot-product attention and the fused flash kernels (ops/attention.h).
#include "bind.h"

namespace td::python {

using namespace pybind11::literals;

void init_attention(py::module_& m, TensorClass& cls) {
  m.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
         bool is_causal, std::optional<double> scale) {
        Tensor mk = or_undefined(mask);
        py::gil_scoped_release unlocked;
        return scaled_dot_product_attention(q, k, v, mk, is_causal, scale);
      },
      "query"_a, "key"_a, "value"_a, "attn_mask"_a = py::none(), "is_causal"_a = false,
      "scale"_a = py::none());
  m.def(
      "flash_attention_forward",
      [](const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double scale) {
        AttentionForward f;
        {
          py::gil_scoped_release unlocked;
          f = flash_attention_forward(q, k, v, is_causal, scale);
        }
        return py::make_tuple(f.out, f.lse);
      },
      "query"_a, "key"_a, "value"_a, "is_causal"_a, "scale"_a);
  m.def("flash_attention_backward", &flash_attention_backward, "grad_out"_a, "query"_a, "key"_a,
        "value"_a, "out"_a, "lse"_a, "is_causal"_a, "scale"_a, nogil());
}

}  // namespace td::python
