// Expert parallelism (parallel/expert_parallel.h) over the ranks of an MPI job: the MoE MLP's
// forward + backward with its experts split over ep = world size, and the all-to-all of its
// dispatched rows alone. Issue 21 asks for the all-to-all time at ep 2 and 4.
//   OMP_NUM_THREADS=1 mpirun -np N ./build/<dir>/benchmarks/bench_moe_ep [tokens] [d] [hidden]
// Every rank routes its own T tokens (weak scaling: the same per-rank work at every N) through
// E = 8 llama SwiGLU experts of hidden H / K, K = 2, dropless; rank r holds experts
// [r E/N, (r+1) E/N). One layer runs four all-to-alls of about T K d (N-1)/N fp32 values per
// rank (dispatch and combine, forward and backward) plus one all-gather of E counts; the
// a2a line times one dispatch-sized all_to_all_rows with the layer's real per-rank counts. One
// JSON line per measurement from rank 0 (times: the slowest rank's median of 5).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/models/moe_mlp.h"
#include "tardelli/parallel/expert_parallel.h"
#include "tardelli/tardelli.h"

namespace {

using td::bench::median;
using td::bench::now;
namespace dist = td::distributed;

// The slowest rank's median seconds of f over `runs` timed runs after one warm-up.
template <typename Fn>
double timed(Fn&& f, const dist::CommPtr& world, int runs) {
  std::vector<double> t;
  for (int it = 0; it <= runs; ++it) {
    world->barrier();
    const double t0 = now();
    f();
    if (it > 0) t.push_back(now() - t0);
  }
  td::Tensor m = td::from_vector<float>({static_cast<float>(median(t))}, {1});
  world->all_reduce(m, dist::ReduceOp::Max);
  return static_cast<double>(m.item<float>());
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int64_t d = argc > 2 ? std::atoll(argv[2]) : 512;
  const int64_t H = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int64_t E = 8, K = 2, He = H / K;
  const int runs = 5;
  const dist::CommPtr world = dist::mpi_world();
  const int64_t n = world->size(), r = world->rank();
  if (E % n != 0) {
    if (r == 0)
      std::fprintf(stderr, "bench_moe_ep: %lld experts do not split over %lld ranks\n",
                   static_cast<long long>(E), static_cast<long long>(n));
    return 2;
  }
  const int64_t El = E / n;

  // The same full weights on every rank (one seed); this rank keeps its experts' slice.
  td::Generator g(7);
  const auto param = [&](const td::Shape& s, double std) {
    return td::mul(td::randn(s, {}, &g), std);
  };
  td::models::MoEParams p;
  p.router_w = param({E, d}, 0.02).set_requires_grad(true);
  p.expert_bias = td::zeros({E});
  p.fc_w = param({E, 2 * He, d}, 0.02).narrow(0, r * El, El).contiguous().set_requires_grad(true);
  p.proj_w = param({E, d, He}, 0.01).narrow(0, r * El, El).contiguous().set_requires_grad(true);
  td::Generator gx(100 + static_cast<uint64_t>(r));  // each rank its own tokens
  td::Tensor x = td::randn({T, d}, {}, &gx).set_requires_grad(true);
  td::Tensor dy = td::randn({T, d}, {}, &gx);

  td::models::MoEOptions o;
  o.num_experts = E;
  o.top_k = K;
  o.act = td::MlpActivation::SwiGLU;
  o.aux_loss_coeff = 0.01;
  o.training = true;
  o.dispatch = td::parallel::expert_parallel_dispatch(world);
  const td::models::MoECastFn cast = [](const td::Tensor& t, td::DType dt) {
    return t.defined() && t.dtype() != dt ? t.to(dt) : t;
  };
  std::vector<int64_t> load;
  const double layer_s = timed(
      [&] {
        for (td::Tensor q : {x, p.router_w, p.fc_w, p.proj_w}) q.set_grad(td::Tensor());
        td::models::MoEForward f = td::models::moe_mlp(x, p, o, cast);
        td::autograd::backward({f.y, f.loss}, {dy, td::Tensor()});
        load = f.routed_per_expert;
      },
      world, runs);

  // The dispatch's all-to-all alone, with the last forward's counts: rank j receives this
  // rank's rows for its experts.
  const auto all = dist::exchange_counts(load, world);
  std::vector<int64_t> send(static_cast<size_t>(n), 0), recv(static_cast<size_t>(n), 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t l = 0; l < El; ++l) {
      send[static_cast<size_t>(j)] += load[static_cast<size_t>(j * El + l)];
      recv[static_cast<size_t>(j)] += all[static_cast<size_t>(j)][static_cast<size_t>(r * El + l)];
    }
  }
  int64_t rows = 0;
  for (int64_t s : send) rows += s;
  td::Tensor payload = td::randn({rows, d}, {}, &gx);
  const double a2a_s = timed(
      [&] {
        td::autograd::NoGradGuard ng;
        dist::all_to_all_rows(payload, send, recv, world);
      },
      world, runs);

  if (r == 0) {
    const double bytes = static_cast<double>(rows) * static_cast<double>(d) * 4.0;
    std::printf(
        "{\"bench\": \"moe_ep\", \"ep\": %lld, \"tokens_per_rank\": %lld, \"d_model\": %lld, "
        "\"experts\": %lld, \"top_k\": %lld, \"expert_hidden\": %lld, \"layer_fwd_bwd_ms\": "
        "%.2f, \"tokens_per_s_per_rank\": %.0f, \"a2a_ms\": %.3f, \"a2a_mib_per_rank\": %.2f, "
        "\"a2a_share_of_layer\": %.4f, \"threads\": %d}\n",
        static_cast<long long>(n), static_cast<long long>(T), static_cast<long long>(d),
        static_cast<long long>(E), static_cast<long long>(K), static_cast<long long>(He),
        layer_s * 1e3, T / layer_s, a2a_s * 1e3, bytes / (1024.0 * 1024.0), 4.0 * a2a_s / layer_s,
        omp_get_max_threads());
  }
  return 0;
}
