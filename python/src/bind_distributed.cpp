// td::distributed (communicators, the process grid, autograd collectives) as
// tardelli._C.distributed. Every call that communicates releases the GIL: other Python threads
// (a data loader, a progress thread) keep running while a rank waits for its peers. The
// torch.distributed-style API with a default group lives in tardelli/distributed/__init__.py.
#include <chrono>

#include "bind.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/hierarchical.h"
#include "tardelli/distributed/host_staged.h"
#include "tardelli/distributed/process_grid.h"

namespace td::python {

using namespace pybind11::literals;
using distributed::CommOptions;
using distributed::CommPtr;
using distributed::Communicator;
using distributed::GridCoords;
using distributed::ParallelDims;
using distributed::ProcessGrid;
using distributed::Work;
using distributed::WorkPtr;

namespace {

CommOptions options_from(std::optional<double> timeout_s, bool check_consistency) {
  CommOptions o;
  if (timeout_s) {
    TD_CHECK(*timeout_s > 0, "timeout_s must be positive, got ", *timeout_s);
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(*timeout_s * 1000.0));
  }
  o.check_consistency = check_consistency;
  return o;
}

distributed::ReduceOp op_of(const std::string& s) {
  return distributed::parse_reduce_op(s);
}

void init_communicator(py::module_& d) {
  py::class_<Work, WorkPtr>(d, "Work", "The handle of an asynchronous collective")
      .def("wait", &Work::wait, nogil(),
           "Blocks until done (raising its error, or a timeout error)")
      .def("is_completed", &Work::is_completed, nogil());

  // Tensors are handles: taking `Tensor t` by value and passing it on as Tensor& writes into
  // the caller's storage.
  py::class_<Communicator, CommPtr>(d, "Communicator", "One group of processes")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("name", &Communicator::name)
      .def_property_readonly("backend", &Communicator::backend)
      .def_property_readonly(
          "timeout_s", [](const Communicator& c) { return c.options().timeout.count() / 1000.0; })
      .def(
          "set_timeout",
          [](Communicator& c, double s) { c.set_timeout(options_from(s, true).timeout); },
          "seconds"_a)
      .def(
          "all_reduce",
          [](Communicator& c, Tensor t, const std::string& op, bool async_op) {
            auto rop = op_of(op);
            py::gil_scoped_release unlocked;
            return c.all_reduce(t, rop, async_op);
          },
          "tensor"_a, "op"_a = "sum", "async_op"_a = false)
      .def(
          "all_gather",
          [](Communicator& c, Tensor out, const Tensor& in, bool async_op) {
            return c.all_gather(out, in, async_op);
          },
          "out"_a, "input"_a, "async_op"_a = false, nogil())
      .def(
          "reduce_scatter",
          [](Communicator& c, Tensor out, const Tensor& in, const std::string& op, bool async_op) {
            auto rop = op_of(op);
            py::gil_scoped_release unlocked;
            return c.reduce_scatter(out, in, rop, async_op);
          },
          "out"_a, "input"_a, "op"_a = "sum", "async_op"_a = false)
      .def(
          "broadcast",
          [](Communicator& c, Tensor t, int root, bool async_op) {
            return c.broadcast(t, root, async_op);
          },
          "tensor"_a, "root"_a, "async_op"_a = false, nogil())
      .def(
          "send",
          [](Communicator& c, const Tensor& t, int dst, int tag, bool async_op) {
            return c.send(t, dst, tag, async_op);
          },
          "tensor"_a, "dst"_a, "tag"_a = 0, "async_op"_a = false, nogil())
      .def(
          "recv",
          [](Communicator& c, Tensor t, int src, int tag, bool async_op) {
            return c.recv(t, src, tag, async_op);
          },
          "tensor"_a, "src"_a, "tag"_a = 0, "async_op"_a = false, nogil())
      .def(
          "all_to_all",
          [](Communicator& c, Tensor out, const Tensor& in, std::vector<int64_t> out_splits,
             std::vector<int64_t> in_splits, bool async_op) {
            return c.all_to_all(out, in, std::move(out_splits), std::move(in_splits), async_op);
          },
          "out"_a, "input"_a, "out_splits"_a = std::vector<int64_t>{},
          "in_splits"_a = std::vector<int64_t>{}, "async_op"_a = false, nogil())
      .def("barrier", &Communicator::barrier, nogil())
      .def(
          "stats",
          [](const Communicator& c) {
            const distributed::CommStats s = c.stats();
            py::dict out;
            out["calls"] = s.calls;
            out["bytes"] = s.bytes;
            out["seconds"] = s.seconds;
            return out;
          },
          "{'calls', 'bytes', 'seconds'}: operations issued on this communicator, their input "
          "bytes and the seconds callers were blocked in them (since creation or reset_stats())")
      .def("reset_stats", &Communicator::reset_stats)
      .def("split", &Communicator::split, "color"_a, "key"_a, "name"_a, nogil(),
           "MPI_Comm_split: a negative color returns None")
      .def("__repr__", [](const Communicator& c) {
        return "<Communicator '" + c.name() + "' rank " + std::to_string(c.rank()) + " of " +
               std::to_string(c.size()) + " (" + c.backend() + ")>";
      });

  d.def(
      "mpi_world",
      [](std::optional<double> timeout_s, bool check_consistency) {
        CommOptions o = options_from(timeout_s, check_consistency);
        py::gil_scoped_release unlocked;
        return distributed::mpi_world(o);
      },
      "timeout_s"_a = py::none(), "check_consistency"_a = true);
  d.def(
      "nccl_communicator",
      [](const CommPtr& comm, int device, std::optional<double> timeout_s) {
        CommOptions o = options_from(timeout_s, true);
        py::gil_scoped_release unlocked;
        return distributed::nccl_communicator(comm, device, o);
      },
      "comm"_a, "device"_a, "timeout_s"_a = py::none());
  d.def("mpi_available", &distributed::mpi_available);
  d.def("finalize", &distributed::finalize, nogil());
  d.def("abort_world", &distributed::abort_world, "code"_a, nogil());
}

void init_grid(py::module_& d) {
  py::class_<GridCoords>(d, "GridCoords")
      .def_readonly("tp", &GridCoords::tp)
      .def_readonly("cp", &GridCoords::cp)
      .def_readonly("pp", &GridCoords::pp)
      .def_readonly("dp", &GridCoords::dp)
      .def_readonly("ep", &GridCoords::ep)
      .def_readonly("edp", &GridCoords::edp)
      .def("__repr__", [](const GridCoords& c) {
        return "GridCoords(tp=" + std::to_string(c.tp) + ", cp=" + std::to_string(c.cp) +
               ", pp=" + std::to_string(c.pp) + ", dp=" + std::to_string(c.dp) +
               ", ep=" + std::to_string(c.ep) + ", edp=" + std::to_string(c.edp) + ")";
      });

  py::class_<ParallelDims>(d, "ParallelDims")
      .def(py::init([](int tp, int cp, int pp, int dp, int ep, std::string order) {
             ParallelDims p;
             p.tp = tp;
             p.cp = cp;
             p.pp = pp;
             p.dp = dp;
             p.ep = ep;
             p.order = std::move(order);
             return p;
           }),
           "tp"_a = 1, "cp"_a = 1, "pp"_a = 1, "dp"_a = 1, "ep"_a = 1, "order"_a = "tp-cp-ep-dp-pp")
      .def_readwrite("tp", &ParallelDims::tp)
      .def_readwrite("cp", &ParallelDims::cp)
      .def_readwrite("pp", &ParallelDims::pp)
      .def_readwrite("dp", &ParallelDims::dp)
      .def_readwrite("ep", &ParallelDims::ep)
      .def_readwrite("order", &ParallelDims::order)
      .def_property_readonly("world_size", &ParallelDims::world_size)
      .def_property_readonly("edp", &ParallelDims::edp)
      .def("validate", &ParallelDims::validate, "world_size"_a)
      .def("rank_groups", &ParallelDims::rank_groups, "axes"_a)
      .def("group_of", &ParallelDims::group_of, "axes"_a, "rank"_a)
      .def("coords", &ParallelDims::coords, "rank"_a)
      .def("rank_of", &ParallelDims::rank_of, "tp"_a = 0, "cp"_a = 0, "pp"_a = 0, "dp"_a = 0)
      .def("__repr__", &ParallelDims::str);

  py::class_<ProcessGrid, std::shared_ptr<ProcessGrid>>(d, "ProcessGrid")
      .def(py::init<CommPtr, ParallelDims, const std::vector<std::string>&>(), "world"_a, "dims"_a,
           "extra_axes"_a = std::vector<std::string>{}, nogil())
      .def_property_readonly("dims", &ProcessGrid::dims)
      .def_property_readonly("coords", &ProcessGrid::coords)
      .def_property_readonly("rank", &ProcessGrid::rank)
      .def_property_readonly("world_size", &ProcessGrid::world_size)
      .def("world", &ProcessGrid::world)
      .def("tp", &ProcessGrid::tp)
      .def("cp", &ProcessGrid::cp)
      .def("pp", &ProcessGrid::pp)
      .def("dp", &ProcessGrid::dp)
      .def("ep", &ProcessGrid::ep)
      .def("edp", &ProcessGrid::edp)
      .def("dp_cp", &ProcessGrid::dp_cp)
      .def("tp_cp", &ProcessGrid::tp_cp)
      .def("tp_pp", &ProcessGrid::tp_pp)
      .def("tp_ep", &ProcessGrid::tp_ep)
      .def("group", &ProcessGrid::group, "axes"_a)
      .def("group_ranks", &ProcessGrid::group_ranks, "axes"_a)
      .def("group_names", &ProcessGrid::group_names)
      .def("is_first_pp_stage", &ProcessGrid::is_first_pp_stage)
      .def("is_last_pp_stage", &ProcessGrid::is_last_pp_stage);
}

void init_collectives(py::module_& d) {
  d.def("hierarchical", &distributed::hierarchical, "comm"_a, "nodes"_a, nogil());
  d.def("host_staged", &distributed::host_staged, "host"_a, "stage_host_tensors"_a = false,
        "A communicator that moves CUDA tensors through host memory over an MPI one "
        "(include/tardelli/distributed/host_staged.h)");
  d.def("nodes_of", &distributed::nodes_of, "world_ranks"_a, "ranks_per_node"_a);
  d.def("cross_node_group", &distributed::cross_node_group, "comm"_a);
  d.def("copy_to_region", &distributed::copy_to_region, "input"_a, "group"_a, nogil());
  d.def("reduce_from_region", &distributed::reduce_from_region, "input"_a, "group"_a, nogil());
  d.def("scatter_to_region", &distributed::scatter_to_region, "input"_a, "group"_a, "dim"_a = -1,
        nogil());
  d.def("gather_from_region", &distributed::gather_from_region, "input"_a, "group"_a, "dim"_a = -1,
        nogil());
  d.def("reduce_scatter_to_sequence", &distributed::reduce_scatter_to_sequence, "input"_a,
        "group"_a, "dim"_a = 0, nogil());
  d.def("gather_from_sequence", &distributed::gather_from_sequence, "input"_a, "group"_a,
        "dim"_a = 0, "tp_output_grad"_a = true, nogil());
  d.def(
      "all_gather_along",
      [](const Tensor& x, const CommPtr& c, int64_t dim) {
        return distributed::all_gather_along(x, c, dim);
      },
      "input"_a, "group"_a, "dim"_a, nogil());
  d.def(
      "reduce_scatter_along",
      [](const Tensor& x, const CommPtr& c, int64_t dim, const std::string& op) {
        auto rop = op_of(op);
        py::gil_scoped_release unlocked;
        return distributed::reduce_scatter_along(x, c, dim, rop);
      },
      "input"_a, "group"_a, "dim"_a, "op"_a = "sum");
  d.def("chunk_along", &distributed::chunk_along, "input"_a, "group"_a, "dim"_a, nogil());
  d.def("sum_over_ranks", &distributed::sum_over_ranks, "value"_a, "group"_a, nogil());
}

}  // namespace

void init_distributed(py::module_& m, TensorClass& cls) {
  py::module_ d = m.def_submodule("distributed", "Communicators and the process grid (C++)");
  init_communicator(d);
  init_grid(d);
  init_collectives(d);
}

}  // namespace td::python
