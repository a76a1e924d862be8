// td::distributed::DistributedDataParallel and DistributedOptimizer (ZeRO-1) as
// tardelli._C.distributed.{DistributedDataParallel, DistributedOptimizer}. Type conversion only
// (Note [Binding layer] in bind.h); the torch-style wrappers (module arguments, no_sync(),
// param_groups dicts) live in tardelli/distributed/data_parallel.py. Must run after
// init_distributed (it adds to that submodule and uses its Communicator class).
#include "bind.h"
#include "tardelli/distributed/data_parallel.h"
#include "tardelli/distributed/distributed_optimizer.h"
#include "tardelli/distributed/fully_sharded.h"
#include "tardelli/models/gpt.h"

namespace td::python {

using namespace pybind11::literals;
using distributed::DDPOptions;
using distributed::DistributedDataParallel;
using distributed::DistributedOptimizer;
using distributed::FSDPOptions;
using distributed::FullyShardedDataParallel;

namespace {

// (params, lr or None, weight_decay or None, {"beta1": .., "beta2": .., "eps": ..})
using GroupSpec = std::tuple<TensorList, std::optional<double>, std::optional<double>,
                             std::map<std::string, double>>;

std::vector<optim::ParamGroup> groups_from(const std::vector<GroupSpec>& specs) {
  std::vector<optim::ParamGroup> out;
  for (const auto& [ps, lr, wd, opts] : specs) out.emplace_back(ps, lr, wd, opts);
  return out;
}

}  // namespace

void init_data_parallel(py::module_& m, TensorClass& /*cls*/) {
  py::module_ d = m.attr("distributed");

  py::class_<distributed::GradCompressor, std::shared_ptr<distributed::GradCompressor>>(
      d, "GradCompressor",
      "PowerSGD / top-k compressed bucket reduction with error feedback "
      "(include/tardelli/distributed/grad_compression.h)")
      .def_property_readonly("name", &distributed::GradCompressor::name)
      .def("elements_sent", &distributed::GradCompressor::elements_sent)
      .def("elements_dense", &distributed::GradCompressor::elements_dense)
      .def_property("active", &distributed::GradCompressor::active,
                    &distributed::GradCompressor::set_active)
      .def("state", &distributed::GradCompressor::state)
      .def("load_state", &distributed::GradCompressor::load_state, "state"_a);
  d.def("powersgd_compressor", &distributed::powersgd_compressor, "rank"_a, "seed"_a = 0);
  d.def("topk_compressor", &distributed::topk_compressor, "ratio"_a, "random"_a = false,
        "seed"_a = 0);

  py::class_<DistributedDataParallel, std::shared_ptr<DistributedDataParallel>>(
      d, "DistributedDataParallel",
      "Bucketed, overlapped gradient averaging over a data-parallel group "
      "(include/tardelli/distributed/data_parallel.h)")
      .def(py::init([](const nn::NamedTensors& params, distributed::CommPtr comm,
                       int64_t bucket_bytes, bool overlap, bool reduce_scatter, bool average,
                       bool shard_grads, std::vector<std::string> own_bucket, double grad_scale,
                       std::shared_ptr<distributed::GradCompressor> compressor) {
             DDPOptions o;
             o.bucket_bytes = bucket_bytes;
             o.overlap = overlap;
             o.reduce_scatter = reduce_scatter;
             o.average = average;
             o.grad_scale = grad_scale;
             o.shard_grads = shard_grads;
             o.own_bucket = std::move(own_bucket);
             o.compressor = std::move(compressor);
             return std::make_shared<DistributedDataParallel>(params, std::move(comm),
                                                              std::move(o));
           }),
           "named_params"_a, "comm"_a, "bucket_bytes"_a = DDPOptions{}.bucket_bytes,
           "overlap"_a = true, "reduce_scatter"_a = false, "average"_a = true,
           "shard_grads"_a = false, "own_bucket"_a = std::vector<std::string>{},
           "grad_scale"_a = 1.0, "compressor"_a = nullptr, nogil())
      .def("set_last_microbatch", &DistributedDataParallel::set_last_microbatch, "last"_a)
      .def("is_last_microbatch", &DistributedDataParallel::is_last_microbatch)
      .def("set_overlap", &DistributedDataParallel::set_overlap, "overlap"_a)
      .def("overlap", [](const DistributedDataParallel& x) { return x.options().overlap; })
      .def("finish_grad_sync", &DistributedDataParallel::finish_grad_sync, nogil())
      .def("zero_grad", &DistributedDataParallel::zero_grad, nogil())
      .def("grads_synced", &DistributedDataParallel::grads_synced)
      .def_property_readonly("comm", &DistributedDataParallel::comm)
      .def_property_readonly("num_buckets",
                             [](const DistributedDataParallel& x) { return x.buckets().size(); })
      .def("bucket_numels",
           [](const DistributedDataParallel& x) {
             std::vector<std::pair<int64_t, int64_t>> r;  // (used, padded)
             for (const auto& b : x.buckets()) r.emplace_back(b.numel, b.padded_numel);
             return r;
           })
      .def("bucket_param_names",
           [](const DistributedDataParallel& x) {
             std::vector<std::vector<std::string>> r;
             for (const auto& b : x.buckets()) {
               r.emplace_back();
               for (size_t i : b.params) r.back().push_back(x.params()[i].name);
             }
             return r;
           })
      .def("num_collectives", &DistributedDataParallel::num_collectives)
      .def("hooks_fired", &DistributedDataParallel::hooks_fired)
      .def("launch_hook_counts", &DistributedDataParallel::launch_hook_counts)
      .def("last_wait_seconds", &DistributedDataParallel::last_wait_seconds)
      .def("shard_grad", &DistributedDataParallel::shard_grad, "bucket"_a)
      .def("grad_buffer_bytes", &DistributedDataParallel::grad_buffer_bytes)
      .def("bucket_shard_ranges", [](const DistributedDataParallel& x) {
        // per bucket: [(name, bucket offset, numel)], padded size, shard size
        std::vector<
            std::tuple<std::vector<std::tuple<std::string, int64_t, int64_t>>, int64_t, int64_t>>
            r;
        for (const auto& b : x.buckets()) {
          std::vector<std::tuple<std::string, int64_t, int64_t>> ps;
          for (size_t i : b.params) {
            ps.emplace_back(x.params()[i].name, x.params()[i].offset, x.params()[i].numel);
          }
          r.emplace_back(ps, b.padded_numel, b.shard_numel);
        }
        return r;
      });

  py::class_<FullyShardedDataParallel, std::shared_ptr<FullyShardedDataParallel>>(
      d, "FullyShardedDataParallel",
      "ZeRO-3: parameters sharded over dp between uses "
      "(include/tardelli/distributed/fully_sharded.h)")
      .def_static(
          "shard",
          [](const std::vector<std::shared_ptr<models::GPT>>& chunks, distributed::CommPtr comm,
             bool prefetch, bool compute_dtype_gathers) {
            return FullyShardedDataParallel::shard(
                chunks, std::move(comm), FSDPOptions{prefetch, true, compute_dtype_gathers});
          },
          "chunks"_a, "comm"_a, "prefetch"_a = true, "compute_dtype_gathers"_a = true, nogil())
      .def("ddp", &FullyShardedDataParallel::ddp, py::return_value_policy::reference_internal)
      .def("param_shards", &FullyShardedDataParallel::param_shards)
      .def("full_parameters", &FullyShardedDataParallel::full_parameters, nogil())
      .def("load_full_parameters", &FullyShardedDataParallel::load_full_parameters, "full"_a,
           nogil())
      .def("gathered_bytes", &FullyShardedDataParallel::gathered_bytes)
      .def("peak_gathered_bytes", &FullyShardedDataParallel::peak_gathered_bytes)
      .def("reset_peak_gathered_bytes", &FullyShardedDataParallel::reset_peak_gathered_bytes)
      .def("num_gathers", &FullyShardedDataParallel::num_gathers);

  py::class_<DistributedOptimizer, std::shared_ptr<DistributedOptimizer>>(
      d, "DistributedOptimizer",
      "ZeRO-1 AdamW over a reduce_scatter DistributedDataParallel "
      "(include/tardelli/distributed/distributed_optimizer.h)")
      .def(py::init([](DistributedDataParallel& ddp, const std::vector<GroupSpec>& groups,
                       double lr, double beta1, double beta2, double eps, double weight_decay,
                       bool offload, std::shared_ptr<FullyShardedDataParallel> fsdp) {
             optim::AdamWOptions o;
             o.lr = lr;
             o.beta1 = beta1;
             o.beta2 = beta2;
             o.eps = eps;
             o.weight_decay = weight_decay;
             return std::make_shared<DistributedOptimizer>(
                 ddp, groups_from(groups), o,
                 fsdp ? fsdp->optimizer_options(offload)
                      : distributed::ShardedOptimizerOptions{.offload = offload});
           }),
           "ddp"_a, "groups"_a, "lr"_a = 1e-3, "beta1"_a = 0.9, "beta2"_a = 0.999, "eps"_a = 1e-8,
           "weight_decay"_a = 1e-2, "offload"_a = false, "fsdp"_a = nullptr,
           py::keep_alive<1, 2>())  // the DDP outlives the optimizer
      .def("step", &DistributedOptimizer::step, nogil())
      .def("zero_grad", &DistributedOptimizer::zero_grad, nogil())
      .def("clip_grad_norm", &DistributedOptimizer::clip_grad_norm, "max_norm"_a, nogil())
      .def("grad_norm", &DistributedOptimizer::grad_norm, nogil())
      .def("scale_grads", &DistributedOptimizer::scale_grads, "factor"_a, nogil())
      .def("set_model_parallel", &DistributedOptimizer::set_model_parallel, "model_parallel"_a,
           "counted"_a)
      .def("set_lr", &DistributedOptimizer::set_lr, "lr"_a)
      .def(
          "set_group_hyperparameters",
          [](DistributedOptimizer& o, size_t g, double lr, double weight_decay) {
            TD_CHECK(g < o.param_groups().size(), "DistributedOptimizer: group ", g,
                     " out of range (", o.param_groups().size(), " groups)");
            TD_CHECK(lr >= 0 && weight_decay >= 0, "DistributedOptimizer: invalid lr ", lr,
                     " or weight_decay ", weight_decay);
            o.param_groups()[g].lr = lr;
            o.param_groups()[g].weight_decay = weight_decay;
          },
          "group"_a, "lr"_a, "weight_decay"_a)
      .def("group_lrs",
           [](const DistributedOptimizer& o) {
             std::vector<double> r;
             for (const auto& g : o.param_groups()) r.push_back(*g.lr);
             return r;
           })
      .def("optimizer_state_bytes", &DistributedOptimizer::optimizer_state_bytes)
      .def("host_state_bytes", &DistributedOptimizer::host_state_bytes)
      .def("write_masters_to_param_shards", &DistributedOptimizer::write_masters_to_param_shards,
           nogil())
      .def("step_count", &DistributedOptimizer::step_count)
      .def("named_state", &DistributedOptimizer::named_state)
      .def("load_named_state", &DistributedOptimizer::load_named_state, "state"_a, nogil())
      .def("sync_master_from_params", &DistributedOptimizer::sync_master_from_params, nogil());
}

}  // namespace td::python
