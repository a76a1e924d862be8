#pragma once
// CUDA streams and events. A Stream is a cheap handle (copy it freely); a stream created with
// Stream::create is destroyed when its last handle goes. Each thread has a current stream per
// device (initially the device's default stream); launchers take it from current_stream().
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

namespace td::cuda {

class Event;

class Stream {
 public:
  // The legacy default stream of `device` (-1: the current device).
  static Stream default_stream(int device = -1);
  // A new stream on `device`. non_blocking: no implicit synchronization with the default
  // stream. Lower priority numbers are higher priorities (cudaDeviceGetStreamPriorityRange).
  static Stream create(int device = -1, bool non_blocking = true, int priority = 0);

  cudaStream_t handle() const { return handle_.get(); }
  int device() const { return device_; }
  // The id the caching allocator keys free blocks by: 0 for the default stream.
  uint64_t id() const { return reinterpret_cast<uintptr_t>(handle_.get()); }
  bool is_default() const { return handle_ == nullptr; }

  // Blocks the host until all work queued on the stream is done.
  void synchronize() const;
  // True when all work queued on the stream is done (never blocks).
  bool query() const;
  // Makes future work on this stream wait for `e` (recorded on any stream, any device).
  void wait(const Event& e) const;

  bool operator==(const Stream& o) const { return handle_ == o.handle_ && device_ == o.device_; }

 private:
  Stream(std::shared_ptr<CUstream_st> handle, int device)
      : handle_(std::move(handle)), device_(device) {}
  std::shared_ptr<CUstream_st> handle_;  // null: the default stream
  int device_ = 0;
};

// The calling thread's current stream on `device` (-1: the current device).
Stream current_stream(int device = -1);
// Makes `s` the calling thread's current stream on s.device().
void set_current_stream(const Stream& s);

// Sets the current stream (and device) for a scope and restores both afterwards.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
  int previous_device_;
};

// A CUDA event on one device; move-only. Record it on a stream, then wait for it from the host
// (synchronize), from another stream (Stream::wait), or time between two events.
class Event {
 public:
  // Created on the current device. enable_timing makes elapsed_ms possible (and recording a
  // little more expensive).
  explicit Event(bool enable_timing = false);
  ~Event();
  Event(Event&&) noexcept = default;
  Event& operator=(Event&&) noexcept = default;

  void record(const Stream& s);
  void synchronize() const;
  bool query() const;
  // Milliseconds from this event to `end`; both recorded, completed, and created with timing.
  float elapsed_ms(const Event& end) const;
  cudaEvent_t handle() const { return event_.get(); }
  int device() const { return device_; }

 private:
  struct Destroy {
    void operator()(CUevent_st* e) const;
  };
  std::unique_ptr<CUevent_st, Destroy> event_;
  int device_ = 0;
};

}  // namespace td::cuda
