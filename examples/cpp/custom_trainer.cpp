// custom_trainer: a C++ trainer of your own around the library's training loop, taken piece by
// piece (include/tardelli/train/trainer.h): the configuration from flags (the same as
// tardelli-train's), the Trainer that lays the model out over the ranks, and a loop of your own
// that calls train_step() and decides what to do with each step's record. Run it like
// tardelli-train, e.g. on two ranks in tensor parallel:
//
//   mpirun -np 2 custom_trainer --synthetic-data --vocab-size 256 --tp 2 --steps 20
//
// It stops early once the training loss has not improved for --patience steps (an example of
// a policy that belongs in a custom loop, not in the library).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tardelli/distributed/communicator.h"
#include "tardelli/train/train_config.h"
#include "tardelli/train/trainer.h"

int main(int argc, char** argv) {
  std::vector<std::string> args;
  int patience = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--patience" && i + 1 < argc) {
      patience = std::atoi(argv[++i]);
    } else {
      args.emplace_back(argv[i]);
    }
  }
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  td::distributed::CommPtr world;
  try {
    if (size != nullptr && std::atoi(size) > 1) world = td::distributed::mpi_world();
    const td::train::TrainConfig cfg = td::train::parse_config(args, world ? world->size() : 1);
    td::train::Trainer trainer(cfg, world);
    double best = 1e300;
    int64_t since_best = 0;
    while (trainer.step() < cfg.steps && since_best < patience) {
      const td::train::StepRecord r = trainer.train_step();
      since_best = r.loss < best ? 0 : since_best + 1;
      if (r.loss < best) best = r.loss;
      if (trainer.is_main()) {
        std::printf("step %lld loss %.4f grad norm %.3f tp %lld dp %lld\n",
                    static_cast<long long>(r.step), r.loss, r.grad_norm,
                    static_cast<long long>(cfg.tp), static_cast<long long>(trainer.dp_size()));
      }
    }
    if (trainer.is_main()) std::printf("custom_trainer: best loss %.4f\n", best);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_trainer: %s\n", e.what());
    if (world != nullptr && world->size() > 1) td::distributed::abort_world(1);
    return 1;
  }
  td::distributed::finalize();
  return 0;
}
