#include <vector>

#include "runtime/cuda_check.cuh"
#include "runtime/device_guard.cuh"
#include "runtime/stream.cuh"
#include "tardelli/core/error.h"

namespace td::cuda {
namespace {

int resolve(int device) {
  return device < 0 ? current_device() : device;
}

// Note [Current stream is thread-local]: as in PyTorch, each host thread picks its own stream
// per device, so a data-loader or communication thread can work on a side stream without
// changing what the training thread launches on. Unset entries mean the default stream.
std::vector<Stream>& current_streams() {
  thread_local std::vector<Stream> streams;
  return streams;
}

}  // namespace

Stream Stream::default_stream(int device) {
  return Stream(nullptr, resolve(device));
}

Stream Stream::create(int device, bool non_blocking, int priority) {
  const int d = resolve(device);
  DeviceGuard guard(d);
  cudaStream_t s = nullptr;
  TD_CUDA_CHECK(cudaStreamCreateWithPriority(
      &s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault, priority));
  // Destroying a stream with work queued is allowed: the work completes first, then the stream
  // is released. Errors at process teardown are ignored (a deleter must not throw).
  return Stream(std::shared_ptr<CUstream_st>(s, [](cudaStream_t p) { (void)cudaStreamDestroy(p); }),
                d);
}

void Stream::synchronize() const {
  DeviceGuard guard(device_);
  TD_CUDA_CHECK(cudaStreamSynchronize(handle()));
}

bool Stream::query() const {
  DeviceGuard guard(device_);
  cudaError_t err = cudaStreamQuery(handle());
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TD_CUDA_CHECK(err);
  return true;
}

void Stream::wait(const Event& e) const {
  DeviceGuard guard(device_);
  TD_CUDA_CHECK(cudaStreamWaitEvent(handle(), e.handle(), 0));
}

Stream current_stream(int device) {
  const int d = resolve(device);
  auto& streams = current_streams();
  if (d < static_cast<int>(streams.size())) return streams[d];
  return Stream::default_stream(d);
}

void set_current_stream(const Stream& s) {
  auto& streams = current_streams();
  while (static_cast<int>(streams.size()) <= s.device()) {
    streams.push_back(Stream::default_stream(static_cast<int>(streams.size())));
  }
  streams[s.device()] = s;
}

StreamGuard::StreamGuard(const Stream& s)
    : previous_(current_stream(s.device())), previous_device_(current_device()) {
  set_device(s.device());  // may throw: before any state changes
  set_current_stream(s);
}

StreamGuard::~StreamGuard() {
  set_current_stream(previous_);  // no CUDA call: cannot fail
  (void)cudaSetDevice(previous_device_);
}

void Event::Destroy::operator()(CUevent_st* e) const {
  (void)cudaEventDestroy(e);
}

Event::Event(bool enable_timing) : device_(current_device()) {
  cudaEvent_t e = nullptr;
  TD_CUDA_CHECK(
      cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
  event_.reset(e);
}

Event::~Event() = default;

void Event::record(const Stream& s) {
  TD_CHECK(s.device() == device_, "Event::record: event of cuda:", device_,
           " recorded on a stream of cuda:", s.device());
  DeviceGuard guard(device_);
  TD_CUDA_CHECK(cudaEventRecord(handle(), s.handle()));
}

void Event::synchronize() const {
  TD_CUDA_CHECK(cudaEventSynchronize(handle()));
}

bool Event::query() const {
  cudaError_t err = cudaEventQuery(handle());
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TD_CUDA_CHECK(err);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  float ms = 0.0f;
  TD_CUDA_CHECK(cudaEventElapsedTime(&ms, handle(), end.handle()));
  return ms;
}

}  // namespace td::cuda
