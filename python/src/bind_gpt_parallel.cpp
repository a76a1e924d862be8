// tardelli._C.parallel.apply_tensor_parallel / apply_parallelism: the parallelize step for the
// fused GPT (parallel/parallelize.h), apply_expert_parallel (parallel/expert_parallel.h), the
// context-parallel attention and zigzag helpers (parallel/context_parallel.h), and put_shard
// (nn::ShardSpec::put: a shard into its place in the full tensor). Type conversion only;
// td.distributed.parallelize (model_parallel.py) wraps it.
#include "bind.h"
#include "tardelli/nn/shard_spec.h"
#include "tardelli/parallel/expert_parallel.h"
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
      "apply_parallelism",
      [](const std::shared_ptr<models::GPT>& model, const distributed::CommPtr& tp,
         const distributed::CommPtr& cp, bool sequence_parallel,
         int64_t make_vocab_size_divisible_by, const std::string& cp_comm) {
        parallel::ParallelOptions o;
        o.sequence_parallel = sequence_parallel;
        o.make_vocab_size_divisible_by = make_vocab_size_divisible_by;
        o.cp_comm = parallel::parse_cp_comm(cp_comm);
        parallel::apply_parallelism(*model, tp, cp, o);
      },
      "model"_a, "tp"_a, "cp"_a, "sequence_parallel"_a = false,
      "make_vocab_size_divisible_by"_a = 128, "cp_comm"_a = "ring", nogil());
  pm.def(
      "context_parallel_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, const distributed::CommPtr& cp,
         bool is_causal, const std::string& comm) {
        return parallel::context_parallel_attention(q, k, v, cp, is_causal,
                                                    parallel::parse_cp_comm(comm));
      },
      "q"_a, "k"_a, "v"_a, "cp"_a, "is_causal"_a = true, "cp_comm"_a = "ring", nogil());
  pm.def(
      "apply_expert_parallel",
      [](const std::shared_ptr<models::GPT>& model, const distributed::CommPtr& ep) {
        parallel::apply_expert_parallel(*model, ep);
      },
      "model"_a, "ep"_a, nogil());
  pm.def("zigzag_positions", &parallel::zigzag_positions, "T"_a, "rank"_a, "size"_a);
  pm.def("zigzag_slice", &parallel::zigzag_slice, "x"_a, "dim"_a, "rank"_a, "size"_a, nogil());
  pm.def("zigzag_gather", &parallel::zigzag_gather, "x"_a, "cp"_a, "dim"_a, nogil());
  pm.def(
      "put_shard",
      [](const Tensor& shard, Tensor& full, int64_t dim, const std::vector<int64_t>& segments,
         int parts, int index) {
        nn::ShardSpec{dim, segments, parts, index}.put(shard, full);
      },
      "shard"_a, "full"_a, "dim"_a, "segments"_a, "parts"_a, "index"_a, nogil());
}

}  // namespace td::python
