// td::parallel (tensor_parallel.h, vocab_parallel.h, rng_tracker.h) as tardelli._C.parallel:
// the tensor-parallel functions and the RNG tracker. The torch-style modules built on them
// (ColumnParallelLinear, ...) live in tardelli/distributed/tensor_parallel.py. Calls that
// communicate release the GIL.
#include <map>
#include <memory>
#include <string>

#include "bind.h"
#include "tardelli/parallel/rng_tracker.h"
#include "tardelli/parallel/tensor_parallel.h"
#include "tardelli/parallel/vocab_parallel.h"

// RngTracker holds its streams in a std::map of unique_ptr: movable, not copyable, but the
// map's copy constructor is unconstrained, so pybind11 must be told.
namespace pybind11::detail {
template <>
struct is_copy_constructible<td::parallel::RngTracker> : std::false_type {};
}  // namespace pybind11::detail

namespace td::python {

using namespace pybind11::literals;
using distributed::CommPtr;
using parallel::RngTracker;

namespace {

Reduction reduction_of(const std::string& s) {
  if (s == "none") return Reduction::None;
  if (s == "mean") return Reduction::Mean;
  if (s == "sum") return Reduction::Sum;
  throw py::value_error(
      "vocab_parallel_cross_entropy: reduction must be 'none', 'mean' or 'sum', got '" + s + "'");
}

void init_functions(py::module_& p) {
  p.def(
      "column_parallel_linear",
      [](const Tensor& x, const Tensor& w_shard, const std::optional<Tensor>& b_shard,
         const CommPtr& group, bool gather_output, bool sequence_parallel, int64_t seq_dim) {
        return parallel::column_parallel_linear(x, w_shard, or_undefined(b_shard), group,
                                                gather_output, sequence_parallel, seq_dim);
      },
      "input"_a, "weight"_a, "bias"_a, "group"_a, "gather_output"_a = false,
      "sequence_parallel"_a = false, "seq_dim"_a = 0, nogil());
  p.def(
      "row_parallel_linear",
      [](const Tensor& x, const Tensor& w_shard, const std::optional<Tensor>& bias,
         const CommPtr& group, bool input_is_parallel, bool sequence_parallel, int64_t seq_dim) {
        return parallel::row_parallel_linear(x, w_shard, or_undefined(bias), group,
                                             input_is_parallel, sequence_parallel, seq_dim);
      },
      "input"_a, "weight"_a, "bias"_a, "group"_a, "input_is_parallel"_a = true,
      "sequence_parallel"_a = false, "seq_dim"_a = 0, nogil());
  p.def("shard_rows", &parallel::shard_rows, "full"_a, "rank"_a, "size"_a);
  p.def("shard_cols", &parallel::shard_cols, "full"_a, "rank"_a, "size"_a);

  p.def("padded_vocab_size", &parallel::padded_vocab_size, "vocab_size"_a, "tp_size"_a,
        "multiple"_a = 128);
  p.def(
      "vocab_range",
      [](int64_t padded_vocab, int rank, int size) {
        const parallel::VocabRange r = parallel::vocab_range(padded_vocab, rank, size);
        return py::make_tuple(r.start, r.end);
      },
      "padded_vocab"_a, "rank"_a, "size"_a, "(start, end) of the ids rank `rank` owns");
  p.def("shard_vocab_rows", &parallel::shard_vocab_rows, "full"_a, "padded_vocab"_a, "rank"_a,
        "size"_a);
  p.def("vocab_parallel_embedding", &parallel::vocab_parallel_embedding, "ids"_a, "weight"_a,
        "group"_a, "vocab_start"_a, "sequence_parallel"_a = false, "seq_dim"_a = 0, nogil());
  p.def(
      "vocab_parallel_cross_entropy",
      [](const Tensor& logits_shard, const Tensor& targets, const CommPtr& group,
         int64_t vocab_start, int64_t true_vocab_size, int64_t ignore_index,
         const std::string& reduction) {
        const Reduction r = reduction_of(reduction);
        py::gil_scoped_release unlocked;
        return parallel::vocab_parallel_cross_entropy(logits_shard, targets, group, vocab_start,
                                                      true_vocab_size, ignore_index, r);
      },
      "logits"_a, "target"_a, "group"_a, "vocab_start"_a, "vocab_size"_a, "ignore_index"_a = -100,
      "reduction"_a = "mean");
}

void init_rng_tracker(py::module_& p) {
  p.attr("DEFAULT_RNG") = parallel::kDefaultRng;
  p.attr("MODEL_PARALLEL_RNG") = parallel::kModelParallelRng;
  p.attr("MODEL_PARALLEL_SEED_OFFSET") = parallel::kModelParallelSeedOffset;
  // get/fork return the tracker's own Generator (not a copy): drawing from it advances the
  // stream, and the tracker is kept alive while the Generator is referenced.
  py::class_<RngTracker>(p, "RngTracker",
                         "Named random streams for tensor-parallel regions (rng_tracker.h)")
      .def(py::init<>())
      .def_static(
          "model_parallel",
          [](uint64_t seed, int tp_rank) {
            return std::make_unique<RngTracker>(RngTracker::model_parallel(seed, tp_rank));
          },
          "seed"_a, "tp_rank"_a)
      .def("add", &RngTracker::add, "name"_a, "seed"_a, "subsequence"_a = 0)
      .def("has", &RngTracker::has, "name"_a)
      .def("__contains__", &RngTracker::has, "name"_a)
      .def(
          "get", [](RngTracker& t, const std::string& name) -> Generator& { return t.get(name); },
          "name"_a, py::return_value_policy::reference_internal)
      .def(
          "fork",
          [](RngTracker& t, const std::string& name) -> Generator& { return *t.fork(name); },
          "name"_a = std::string(parallel::kModelParallelRng),
          py::return_value_policy::reference_internal)
      .def("names", &RngTracker::names)
      .def("reset", &RngTracker::reset)
      .def("states", &RngTracker::states)
      .def("set_states", &RngTracker::set_states, "states"_a)
      .def("__repr__", [](const RngTracker& t) {
        std::string s = "RngTracker(";
        const auto names = t.names();
        for (size_t i = 0; i < names.size(); ++i) s += (i ? ", '" : "'") + names[i] + "'";
        return s + ")";
      });
}

}  // namespace

void init_parallel(py::module_& m, TensorClass& /*cls*/) {
  py::module_ p = m.def_submodule("parallel", "Tensor-parallel functions and RNG tracker (C++)");
  init_functions(p);
  init_rng_tracker(p);
}

}  // namespace td::python
