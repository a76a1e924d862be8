#include "tardelli/train/supervision.h"

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/train/metrics_file.h"

namespace td::train {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  }
  return true;
}

// TD_TEST_FAULT's items that name this attempt, rank and step: the signal to send (0: none).
int injected_signal(int rank, int64_t step) {
  const std::string spec = env("TD_TEST_FAULT");
  if (spec.empty()) return 0;
  const std::optional<int> attempt = supervised_attempt();
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    std::vector<std::string> parts;
    std::stringstream fields(item);
    std::string f;
    while (std::getline(fields, f, ':')) parts.push_back(f);
    const char* keys[] = {"attempt", "rank", "step"};
    bool ok = parts.size() == 4 && (parts[3] == "kill" || parts[3] == "stop");
    for (size_t k = 0; ok && k < 3; ++k) {
      ok = parts[k].rfind(keys[k], 0) == 0 &&
           all_digits(parts[k].substr(std::string(keys[k]).size()));
    }
    TD_CHECK(ok, "TD_TEST_FAULT='", spec, "': expected attempt<A>:rank<R>:step<S>:kill|stop");
    if (attempt && std::stoi(parts[0].substr(7)) == *attempt &&
        std::stoi(parts[1].substr(4)) == rank && std::stoll(parts[2].substr(4)) == step) {
      return parts[3] == "kill" ? SIGKILL : SIGSTOP;
    }
  }
  return 0;
}

}  // namespace

std::optional<int> supervised_attempt() {
  const std::string v = env("TD_RESTART_ATTEMPT");
  if (!all_digits(v)) return std::nullopt;
  return std::stoi(v);
}

std::string restart_cause() {
  return env("TD_RESTART_CAUSE");
}

void heartbeat(int rank, int64_t step, bool done) {
  const std::string dir = env("TD_HEARTBEAT_DIR");
  if (dir.empty()) return;
  if (const int sig = injected_signal(rank, step)) ::kill(::getpid(), sig);
  json::Value beat = json::Object{};
  beat.set("rank", rank);
  beat.set("pid", static_cast<int64_t>(::getpid()));
  beat.set("step", step);
  beat.set("done", done);
  write_text_file(dir + "/rank" + std::to_string(rank), python_json(beat));
}

}  // namespace td::train
