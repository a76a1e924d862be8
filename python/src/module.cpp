// The extension module tardelli._C: the Tensor class first (every family adds functions and
// methods to it), then one init per layer / op family. See Note [Binding layer] in bind.h.
#include "bind.h"

PYBIND11_MODULE(_C, m) {
  namespace tp = td::python;
  m.doc() = "Tardelli C++ core (use the `tardelli` package, not this module directly)";
  tp::TensorClass cls(m, "Tensor");
  tp::init_core(m, cls);
  tp::init_autograd(m, cls);
  tp::init_elementwise(m, cls);
  tp::init_reduction(m, cls);
  tp::init_activation(m, cls);
  tp::init_softmax(m, cls);
  tp::init_norm(m, cls);
  tp::init_loss(m, cls);
  tp::init_embedding(m, cls);
  tp::init_rotary(m, cls);
  tp::init_adamw(m, cls);
  tp::init_loss_scaler(m, cls);
  tp::init_matmul(m, cls);
  tp::init_attention(m, cls);
  tp::init_indexing(m, cls);
  tp::init_join(m, cls);
  tp::init_dropout(m, cls);
  tp::init_models(m, cls);
  tp::init_hf(m, cls);
  tp::init_data(m, cls);
  tp::init_checkpoint(m, cls);
  tp::init_distributed(m, cls);
  tp::init_data_parallel(m, cls);
  tp::init_parallel(m, cls);
  tp::init_gpt_parallel(m, cls);
  tp::init_pipeline(m, cls);
  tp::init_precision(m, cls);
  tp::init_train(m, cls);
}
