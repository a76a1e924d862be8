// tardelli-train: trains a GPT with the C++ training loop (include/tardelli/train/trainer.h).
// It takes the flags and TOML config of `python -m tardelli.train` (tardelli-train --help) and
// writes the same metrics rows and closing summary:
//
//   mpirun -np 4 tardelli-train --synthetic-data --vocab-size 512 --tp 2 --pp 2 --steps 100
//
// One process trains alone; under mpirun/srun (or python -m tardelli.launch) each process is
// one rank of the job. Exit status: 0 done, 2 a bad configuration (the message names the flag;
// every rank rejects it alike), 1 a run-time error (the whole job is ended so no rank waits in
// a collective for the failed one).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/core/json.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/train/metrics_file.h"
#include "tardelli/train/train_config.h"
#include "tardelli/train/trainer.h"

namespace {

// The job's size as the launcher tells it (Open MPI, MPICH/PMI, PMIx, SLURM); 1 alone.
int launched_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  td::distributed::CommPtr world;
  try {
    if (launched_size() > 1) world = td::distributed::mpi_world();
    const td::train::TrainConfig cfg = td::train::parse_config(args, world ? world->size() : 1);
    td::train::Trainer trainer(cfg, world);
    const td::json::Value summary = trainer.run([](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
    if (trainer.is_main()) std::printf("%s\n", td::train::python_json(summary).c_str());
  } catch (const td::train::HelpRequested& h) {
    std::printf("%s", h.text().c_str());
    return 0;
  } catch (const td::train::ConfigError& e) {
    // Like argparse: a malformed command line also shows the usage line.
    if (e.usage()) std::fprintf(stderr, "%s", td::train::usage_text().c_str());
    std::fprintf(stderr, "tardelli-train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tardelli-train: error: %s\n", e.what());
    std::fflush(stderr);
    std::fflush(stdout);
    if (world != nullptr && world->size() > 1) td::distributed::abort_world(1);
    return 1;
  }
  td::distributed::finalize();
  return 0;
}
