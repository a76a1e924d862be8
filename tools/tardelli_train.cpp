// tardelli-train: trains a GPT with the C++ training loop (include/tardelli/train/trainer.h).
// It takes the flags and TOML config of `python -m tardelli.train` (tardelli-train --help) and
// writes the same metrics rows and closing summary:
//
//   mpirun -np 4 tardelli-train --synthetic-data --vocab-size 512 --tp 2 --pp 2 --steps 100
//
// One process trains alone; under mpirun/srun (or python -m tardelli.launch) each process is
// one rank of the job. --plan auto asks the planner, which is Python (python/tardelli/plan):
// rank 0 runs python -m tardelli.train's parser in $TD_PYTHON (default python3), which
// resolves the layout, and hands every rank the resulting configuration. Exit status: 0 done,
// 2 a bad configuration (the message names the flag; every rank rejects it alike), 1 a
// run-time error (the whole job is ended so no rank waits in a collective for the failed one).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/core/json.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/ops/factory.h"
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

// The Python front end's parse of `args` for `world_size` ranks (it runs the planner for --plan
// auto): its log lines are echoed, the configuration returned as JSON text; ConfigError with
// the parser's message, or naming the interpreter when Python or the package is missing.
constexpr const char* kPlanScript = R"(
import json, sys
try:
    from tardelli.train import config as C
except Exception as e:
    print(json.dumps({"missing": f"{type(e).__name__}: {e}"}))
    sys.exit(0)
try:
    cfg, _ = C.parse_config(sys.argv[2:], int(sys.argv[1]))
except C.ConfigError as e:
    print(json.dumps({"error": str(e)}))
    sys.exit(0)
cfg.plan = ""
print(json.dumps({"config": cfg.to_dict()}))
)";

std::string python_parse(const std::vector<std::string>& args, int world_size) {
  const char* env = std::getenv("TD_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "python3";
  std::vector<std::string> argv = {python, "-c", kPlanScript, std::to_string(world_size)};
  argv.insert(argv.end(), args.begin(), args.end());
  int fds[2];
  if (pipe(fds) != 0) throw td::train::ConfigError("--plan auto: cannot create a pipe");
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "tardelli-train: cannot run %s\n", cargv[0]);
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::vector<std::string> lines;
  for (size_t at = 0; at < out.size();) {
    const size_t end = out.find('\n', at);
    lines.push_back(out.substr(at, end == std::string::npos ? std::string::npos : end - at));
    at = end == std::string::npos ? out.size() : end + 1;
  }
  const std::string hint =
      " (--plan auto runs the planner, which is Python: set TD_PYTHON to an "
      "interpreter that imports the tardelli package, or run python -m "
      "tardelli.plan and give its layout flags)";
  if (lines.empty() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw td::train::ConfigError("--plan auto: " + python + " failed" + hint);
  }
  for (size_t i = 0; i + 1 < lines.size(); ++i) std::printf("%s\n", lines[i].c_str());
  const td::json::Value v = td::json::parse(lines.back());
  if (const td::json::Value* m = v.find("missing")) {
    throw td::train::ConfigError("--plan auto: " + python + ": " + m->as_string() + hint);
  }
  if (const td::json::Value* e = v.find("error")) throw td::train::ConfigError(e->as_string());
  return td::json::dump(v.at("config"));
}

// The configuration of a job: parse_config, or under --plan auto rank 0's python_parse handed
// to every rank (an error travels as such, so every rank fails alike).
td::train::TrainConfig job_config(const std::vector<std::string>& args,
                                  const td::distributed::CommPtr& world) {
  const int size = world ? world->size() : 1;
  td::train::TrainConfig read = td::train::read_config(args);
  if (read.plan.empty()) return td::train::checked_config(std::move(read), size);
  std::string text;  // "C" + config JSON, or "E" + error message
  if (world == nullptr || world->rank() == 0) {
    try {
      text = "C" + python_parse(args, size);
    } catch (const td::train::ConfigError& e) {
      text = std::string("E") + e.what();
    }
  }
  if (world != nullptr && size > 1) {
    td::Tensor n = td::full({1}, static_cast<double>(text.size()), {td::DType::Int64});
    world->broadcast(n, 0);
    const int64_t len = n.item<int64_t>();
    td::Tensor chars = td::zeros({len}, {td::DType::Int32});  // one character per element
    if (world->rank() == 0) {
      std::copy(text.begin(), text.end(), chars.data_ptr<int32_t>());
    }
    world->broadcast(chars, 0);
    const auto* p = chars.data_ptr<int32_t>();
    text.assign(p, p + len);
  }
  if (text.empty() || text[0] != 'C') throw td::train::ConfigError(text.substr(1));
  return td::train::from_json(td::json::parse(text.substr(1)), "--plan auto");
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  td::distributed::CommPtr world;
  try {
    if (launched_size() > 1) world = td::distributed::mpi_world();
    const td::train::TrainConfig cfg = job_config(args, world);
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
