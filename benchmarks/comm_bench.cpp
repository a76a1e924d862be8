// Collective bandwidth of td::distributed::Communicator (MPI backend) next to the same
// collectives called directly through MPI (blocking MPI_Allreduce etc.), nccl-tests style, then
// how much of an async all_reduce hides behind compute.
//   OMP_NUM_THREADS=1 mpirun -np 2 ./build/<dir>/benchmarks/comm_bench [max_bytes]
// One JSON line per (op, size): size_bytes (nccl-tests' convention: the whole buffer, i.e.
// all_gather's output, reduce_scatter's input, all_to_all's per-rank input), time_us (td, no
// consistency check), algbw_GBps = size / time, busbw_GBps = algbw * factor (all_reduce
// 2(n-1)/n, all_gather and reduce_scatter and all_to_all (n-1)/n, broadcast 1), the same for raw
// MPI, td_over_mpi = time_us / mpi_time_us, and checked_time_us (td with the default cross-rank
// consistency check). Then one "overlap" line: overlap = (t_comm + t_comp - t_both) /
// min(t_comm, t_comp), for td's async all_reduce (progress thread) and for a raw
// MPI_Iallreduce completed by MPI_Wait after the compute (no progress thread).
//
// On GPUs (issue 23):  mpirun -np N comm_bench [max_bytes] --device cuda [--gpu-comm nccl|staged]
// times the same collectives plus a tagged send/recv ping-pong on CUDA tensors of
// cuda:{local rank % GPUs}, through NCCL (one rank per GPU; one rank exercises NCCL alone) or
// host staging over MPI (ranks sharing a GPU: the default when they do). No raw-MPI column and no
// overlap line there; each line names the device and the backend.
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/distributed/host_staged.h"
#include "tardelli/tardelli.h"

namespace dist = td::distributed;

namespace {

using td::bench::now;

// Mean seconds per call of f over the slowest rank, after a warmup; iterations adapt to size so
// that each measurement lasts about 0.1-0.2 s.
double time_per_call(const std::function<void()>& f) {
  f();
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now();
  f();
  double once = now() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int iters = std::clamp(static_cast<int>(0.15 / std::max(once, 1e-7)), 3, 2000);
  MPI_Barrier(MPI_COMM_WORLD);
  t0 = now();
  for (int i = 0; i < iters; ++i) f();
  double t = (now() - t0) / iters;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

struct Case {
  const char* op;
  double busbw_factor;
  std::function<void()> td_checked, td, mpi;
};

}  // namespace

// The local rank from the launcher's environment (0 when none says).
int local_rank() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return 0;
}

// The GPU mode (see the header): every collective and a ping-pong on CUDA tensors.
int run_on_gpu(int64_t max_bytes, std::string how) {
  const dist::CommOptions unchecked{std::chrono::minutes(5), false};
  dist::CommPtr mpi = dist::mpi_world(unchecked);
  const int n = mpi->size(), me = mpi->rank();
  if (!td::cuda_available()) {
    if (me == 0) std::printf("{\"bench\": \"comm\", \"skipped\": \"no CUDA device\"}\n");
    dist::finalize();
    return 0;
  }
  const int gpus = td::cuda_device_count();
  const int dev = local_rank() % gpus;
  const bool shared = n > gpus;  // one node: more ranks than GPUs means some share
  if (how.empty()) how = shared ? "staged" : "nccl";
  dist::CommPtr comm =
      how == "nccl" ? dist::nccl_communicator(mpi, dev, unchecked) : dist::host_staged(mpi);
  const td::TensorOptions o{td::DType::Float32, td::cuda_device(dev), false};
  const dist::ReduceOp sum = dist::ReduceOp::Sum;
  for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 16) {
    const int64_t total = std::max<int64_t>(n, bytes / 4 / n * n), chunk = total / n;
    td::Tensor full = td::ones({total}, o), part = td::ones({chunk}, o),
               full2 = td::ones({total}, o);
    std::vector<Case> cases = {
        {"all_reduce", 2.0 * (n - 1) / n, {}, [&] { comm->all_reduce(full, sum); }, {}},
        {"all_gather",
         static_cast<double>(n - 1) / n,
         {},
         [&] { comm->all_gather(full, part); },
         {}},
        {"reduce_scatter",
         static_cast<double>(n - 1) / n,
         {},
         [&] { comm->reduce_scatter(part, full, sum); },
         {}},
        {"broadcast", 1.0, {}, [&] { comm->broadcast(full, 0); }, {}},
        {"all_to_all",
         static_cast<double>(n - 1) / n,
         {},
         [&] { comm->all_to_all(full2, full); },
         {}},
    };
    if (n >= 2) {  // rank 0 <-> rank 1, tagged as the pipeline's messages are; time per trip
      cases.push_back({"send_recv",
                       1.0,
                       {},
                       [&] {
                         if (me == 0) {
                           comm->send(full, 1, 7);
                           comm->recv(full2, 1, 8);
                         } else if (me == 1) {
                           comm->recv(full2, 0, 7);
                           comm->send(full, 0, 8);
                         }
                       },
                       {}});
    }
    for (const Case& c : cases) {
      td::cuda_synchronize();
      const double t = time_per_call(c.td);
      const double sz = static_cast<double>(total) * 4;
      if (me == 0) {
        std::printf(
            "{\"bench\": \"comm\", \"device\": \"cuda\", \"backend\": \"%s\", "
            "\"op\": \"%s\", \"ranks\": %d, \"gpus\": %d, \"size_bytes\": %.0f, "
            "\"time_us\": %.2f, \"algbw_GBps\": %.3f, \"busbw_GBps\": %.3f}\n",
            comm->backend(), c.op, n, gpus, sz, t * 1e6, sz / t / 1e9,
            sz / t / 1e9 * c.busbw_factor);
        std::fflush(stdout);
      }
    }
  }
  comm.reset();
  mpi.reset();
  dist::finalize();
  return 0;
}

int main(int argc, char** argv) {
  int64_t max_bytes = int64_t{64} << 20;
  std::string device = "cpu", how;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else if (a == "--gpu-comm" && i + 1 < argc) {
      how = argv[++i];
    } else {
      max_bytes = std::atoll(argv[i]);
    }
  }
  if (device == "cuda") return run_on_gpu(max_bytes, how);
  dist::CommPtr checked = dist::mpi_world();
  dist::CommPtr comm = dist::mpi_world(dist::CommOptions{std::chrono::minutes(5), false});
  const int n = comm->size(), me = comm->rank();
  const dist::ReduceOp sum = dist::ReduceOp::Sum;

  std::vector<int64_t> sizes;
  for (int64_t s = 8; s <= max_bytes; s *= 4) sizes.push_back(s);
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);

  for (int64_t bytes : sizes) {
    // Whole-buffer element count, a multiple of n (at least n).
    int64_t total = std::max<int64_t>(n, bytes / 4 / n * n);
    int64_t chunk = total / n;
    td::Tensor full = td::ones({total}), part = td::ones({chunk});
    td::Tensor full2 = td::ones({total});
    int count = static_cast<int>(total), ccount = static_cast<int>(chunk);
    std::vector<Case> cases = {
        {"all_reduce", 2.0 * (n - 1) / n, [&] { checked->all_reduce(full, sum); },
         [&] { comm->all_reduce(full, sum); },
         [&] {
           MPI_Allreduce(MPI_IN_PLACE, full.data_ptr(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
         }},
        {"all_gather", static_cast<double>(n - 1) / n, [&] { checked->all_gather(full, part); },
         [&] { comm->all_gather(full, part); },
         [&] {
           MPI_Allgather(part.data_ptr(), ccount, MPI_FLOAT, full.data_ptr(), ccount, MPI_FLOAT,
                         MPI_COMM_WORLD);
         }},
        {"reduce_scatter", static_cast<double>(n - 1) / n,
         [&] { checked->reduce_scatter(part, full, sum); },
         [&] { comm->reduce_scatter(part, full, sum); },
         [&] {
           MPI_Reduce_scatter_block(full.data_ptr(), part.data_ptr(), ccount, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
         }},
        {"broadcast", 1.0, [&] { checked->broadcast(full, 0); }, [&] { comm->broadcast(full, 0); },
         [&] { MPI_Bcast(full.data_ptr(), count, MPI_FLOAT, 0, MPI_COMM_WORLD); }},
        {"all_to_all", static_cast<double>(n - 1) / n, [&] { checked->all_to_all(full2, full); },
         [&] { comm->all_to_all(full2, full); },
         [&] {
           MPI_Alltoall(full.data_ptr(), ccount, MPI_FLOAT, full2.data_ptr(), ccount, MPI_FLOAT,
                        MPI_COMM_WORLD);
         }},
    };
    for (const Case& c : cases) {
      double t_td = time_per_call(c.td);
      double t_mpi = time_per_call(c.mpi);
      double t_chk = time_per_call(c.td_checked);
      double sz = static_cast<double>(total) * 4;
      if (me == 0) {
        std::printf(
            "{\"bench\": \"comm\", \"op\": \"%s\", \"ranks\": %d, \"size_bytes\": %.0f, "
            "\"time_us\": %.2f, \"algbw_GBps\": %.3f, \"busbw_GBps\": %.3f, "
            "\"mpi_time_us\": %.2f, \"mpi_busbw_GBps\": %.3f, \"td_over_mpi\": %.3f, "
            "\"checked_time_us\": %.2f}\n",
            c.op, n, sz, t_td * 1e6, sz / t_td / 1e9, sz / t_td / 1e9 * c.busbw_factor, t_mpi * 1e6,
            sz / t_mpi / 1e9 * c.busbw_factor, t_td / t_mpi, t_chk * 1e6);
        std::fflush(stdout);
      }
    }
  }

  // Overlap: a 16 MiB all_reduce against a GEMM loop of about the same duration.
  const int64_t ar_count = int64_t{4} << 20;
  td::Tensor grad = td::ones({ar_count});
  td::Tensor a = td::randn({384, 384}), b = td::randn({384, 384});
  auto gemm_once = [&] {
    td::Tensor c = td::mm(a, b);
    (void)c;
  };
  double t_comm = time_per_call([&] { comm->all_reduce(grad, sum); });
  double t_gemm = time_per_call(gemm_once);
  int reps = std::max(1, static_cast<int>(t_comm / t_gemm));
  MPI_Bcast(&reps, 1, MPI_INT, 0, MPI_COMM_WORLD);
  auto compute = [&] {
    for (int i = 0; i < reps; ++i) gemm_once();
  };
  double t_comp = time_per_call(compute);
  double t_both = time_per_call([&] {
    dist::WorkPtr w = comm->all_reduce(grad, sum, true);
    compute();
    w->wait();
  });
  int ar_int = static_cast<int>(ar_count);
  double t_raw_comm = time_per_call([&] {
    MPI_Allreduce(MPI_IN_PLACE, grad.data_ptr(), ar_int, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  double t_raw_both = time_per_call([&] {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, grad.data_ptr(), ar_int, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
    compute();
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  });
  auto overlap = [](double tc, double tp, double tb) { return (tc + tp - tb) / std::min(tc, tp); };
  if (me == 0) {
    std::printf(
        "{\"bench\": \"comm_overlap\", \"ranks\": %d, \"all_reduce_bytes\": %lld, "
        "\"gemm\": \"%d x 384^3 fp32\", \"t_comm_ms\": %.2f, \"t_comp_ms\": %.2f, "
        "\"t_both_ms\": %.2f, \"overlap\": %.3f, \"mpi_nonblocking_t_comm_ms\": %.2f, "
        "\"mpi_nonblocking_t_both_ms\": %.2f, \"mpi_nonblocking_overlap\": %.3f, "
        "\"omp_threads\": %d}\n",
        n, static_cast<long long>(ar_count * 4), reps, t_comm * 1e3, t_comp * 1e3, t_both * 1e3,
        overlap(t_comm, t_comp, t_both), t_raw_comm * 1e3, t_raw_both * 1e3,
        overlap(t_raw_comm, t_comp, t_raw_both), omp_get_max_threads());
  }
  comm.reset();
  checked.reset();
  dist::finalize();
  return 0;
}
