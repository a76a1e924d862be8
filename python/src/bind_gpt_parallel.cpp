// tardelli._C.parallel.apply_tensor_parallel: the parallelize step for the fused GPT
// (parallel/parallelize.h), and put_shard (nn::ShardSpec::put: a shard into its place in the
// full tensor). Type conversion only; td.distributed.parallelize (model_parallel.py) wraps it.
#include "bind.h"
#include "tardelli/nn/shard_spec.h"
#include "tardelli/parallel/parallelize.h"

namespace td::python {

using namespace pybind11::literals;

void init_gpt_parallel(py::module_& m, TensorClass& /*cls*/) {
  py::module_ pm = m.def_submodule("parallel", "Tensor / sequence parallel layers (C++)");
  pm.def(
      "apply_tensor_parallel",
      [](const std::shared_ptr<models::GPT>& model, const distributed::CommPtr& tp,
         bool sequence_parallel, int64_t make_vocab_size_divisible_by) {
        parallel::ParallelOptions o;
        o.sequence_parallel = sequence_parallel;
        o.make_vocab_size_divisible_by = make_vocab_size_divisible_by;
        parallel::apply_tensor_parallel(*model, tp, o);
      },
      "model"_a, "tp"_a, "sequence_parallel"_a = false, "make_vocab_size_divisible_by"_a = 128,
      nogil());
  pm.def(
      "put_shard",
      [](const Tensor& shard, Tensor& full, int64_t dim, const std::vector<int64_t>& segments,
         int parts, int index) {
        nn::ShardSpec{dim, segments, parts, index}.put(shard, full);
      },
      "shard"_a, "full"_a, "dim"_a, "segments"_a, "parts"_a, "index"_a, nogil());
}

}  // namespace td::python
