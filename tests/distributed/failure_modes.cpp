// Multi-rank programs that must FAIL in bounded time; ctest runs them under mpirun through
// run_expect_failure.cmake (see tests/distributed/CMakeLists.txt).
//   dead_rank: rank 1 dies (std::_Exit(3)) before an all_reduce that rank 0 enters.
//   skip_rank: rank 1 skips an all_reduce; rank 0 times out (TD_COMM_TIMEOUT_S=2), prints the
//              error and calls abort_world.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tardelli/distributed/communicator.h"
#include "tardelli/ops/factory.h"

namespace dist = td::distributed;

int main(int argc, char** argv) {
  if (argc != 2 ||
      (std::strcmp(argv[1], "dead_rank") != 0 && std::strcmp(argv[1], "skip_rank") != 0)) {
    std::fprintf(stderr, "usage: %s dead_rank|skip_rank\n", argv[0]);
    return 2;
  }
  const bool dead = std::strcmp(argv[1], "dead_rank") == 0;
  if (!dead) setenv("TD_COMM_TIMEOUT_S", "2", 1);  // the environment's override of the default
  dist::CommOptions options;
  if (dead) options.timeout = std::chrono::seconds(10);
  dist::CommPtr world = dist::mpi_world(options);
  world->barrier();
  auto t0 = std::chrono::steady_clock::now();
  if (world->rank() == 1) {
    if (dead) std::_Exit(3);
    std::this_thread::sleep_for(std::chrono::seconds(10));  // skips the all_reduce
  } else {
    td::Tensor t = td::ones({1000});
    try {
      world->all_reduce(t);
    } catch (const td::Error& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "rank %d caught after %.1f s: %s\n", world->rank(), s, e.what());
      dist::abort_world(7);
    }
    std::fprintf(stderr, "rank %d: all_reduce completed although a peer never joined\n",
                 world->rank());
  }
  world.reset();
  dist::finalize();
  return 0;
}
