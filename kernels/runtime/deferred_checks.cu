// Deferred device checks (Note [Deferred device checks] in the header).
#include <mutex>
#include <vector>

#include "runtime/cuda_check.cuh"
#include "runtime/deferred_checks.cuh"
#include "runtime/device_guard.cuh"
#include "tardelli/core/error.h"

namespace td::cuda {
namespace {

struct Pending {
  int device;
  cudaEvent_t done;
  std::function<std::string()> verify;
};

struct Registry {
  std::mutex mu;
  std::vector<Pending> pending;
};

// Never destroyed: checks may still be pending when static destructors run.
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

// Runs `checks` in order; returns the first failure's message.
std::string run(std::vector<Pending>& checks) {
  std::string first;
  for (Pending& c : checks) {
    std::string msg;
    try {
      DeviceGuard guard(c.device);
      TD_CUDA_CHECK(cudaEventSynchronize(c.done));
      msg = c.verify();
    } catch (const std::exception& e) {
      msg = e.what();
    }
    cudaEventDestroy(c.done);
    if (first.empty() && !msg.empty()) first = std::move(msg);
  }
  checks.clear();
  return first;
}

thread_local bool running = false;  // a check's own reads must not run the checks again

}  // namespace

void defer_check(const Stream& stream, std::function<std::string()> verify) {
  DeviceGuard guard(stream.device());
  // Inside a graph capture nothing has run yet and replays overwrite the verdict: no check
  // (Note [CUDA graphs] in include/tardelli/core/cuda_graph.h: validate by an eager step first).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TD_CUDA_CHECK(cudaStreamIsCapturing(stream.handle(), &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return;
  cudaEvent_t e = nullptr;
  TD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t rc = cudaEventRecord(e, stream.handle());
  if (rc != cudaSuccess) {
    cudaEventDestroy(e);
    TD_CUDA_CHECK(rc);
  }
  bool full = false;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.pending.push_back({stream.device(), e, std::move(verify)});
    full = r.pending.size() >= kMaxPendingChecks;
  }
  if (full) run_deferred_checks();
}

void run_deferred_checks() {
  if (running) return;
  std::vector<Pending> checks;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.pending.empty()) return;
    checks.swap(r.pending);
  }
  running = true;
  const std::string first = run(checks);
  running = false;
  TD_CHECK(first.empty(), first,
           " (found by a deferred device check at the first read of device memory to the host "
           "after the op: Note [Deferred device checks])");
}

size_t pending_deferred_checks() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.pending.size();
}

}  // namespace td::cuda
