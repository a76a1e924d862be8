#pragma once
// CUDA graphs: capture a sequence of td operations once, replay it with one launch.
//
// Note [CUDA graphs]: capture_begin() switches the calling thread's current stream on the
// graph's device to a capture stream (ordered after the work queued so far) and starts CUDA's
// stream capture there; every td op the thread then runs on that device is recorded, not
// executed. capture_end() ends the capture, instantiates the graph and restores the previous
// stream. replay() launches the whole graph on the current stream: the same kernels on the same
// addresses with the same arguments. So:
// - Inputs are static: write new data into the tensors the capture read (copy_) before a
//   replay; outputs are the tensors the capture produced, rewritten by each replay.
// - Memory allocated during the capture comes from the capture stream's blocks, which stay
//   reserved while the graph lives (Note [Graph memory pools] in caching_allocator.h), so
//   replays never write over memory handed out since. Tensors made before the capture that
//   it reads (inputs, parameters, gradients it accumulates into) must be kept alive as long as
//   the graph: if one is freed, its memory goes back to the eager pool while replays still
//   read it.
// - Host values are frozen at capture (a learning rate or a step count passed by value, a
//   shape-dependent choice): a captured optimizer step must read such values from device
//   tensors. Operations that wait for the device (item(), to("cpu"), a blocking collective)
//   cannot be captured: capture_end() then fails with CUDA's reason and the graph stays empty;
//   deferred device checks are not registered during a capture (run an eager step first).
// - Run the captured work eagerly once or twice before capturing (warm-up), so that one-time
//   setup (cuBLASLt/cuDNN plans, workspace allocations, lazily created state) happens outside.
// Without the CUDA backend the constructor throws td::Error.
#include <memory>

namespace td {

class CudaGraph {
 public:
  // A graph of CUDA device `device` (-1: the current device).
  explicit CudaGraph(int device = -1);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void capture_begin();
  // Ends the capture begun by this thread; td::Error (naming CUDA's reason) when it failed.
  void capture_end();
  // Launches the captured graph on the current stream of its device (asynchronous).
  void replay();
  // True after a successful capture_end().
  bool ready() const;
  int device() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace td
