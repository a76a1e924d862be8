// td::CudaGraph on the CUDA runtime (Note [CUDA graphs] in include/tardelli/core/cuda_graph.h).
#include <optional>

#include "device/device_query.cuh"
#include "runtime/cuda_allocator.cuh"
#include "runtime/cuda_check.cuh"
#include "runtime/device_guard.cuh"
#include "runtime/stream.cuh"
#include "tardelli/core/cuda_graph.h"
#include "tardelli/core/error.h"

namespace td {

struct CudaGraph::Impl {
  int device = 0;
  std::optional<cuda::Stream> capture;   // the capture stream: kept while the graph lives
  std::optional<cuda::Stream> previous;  // the current stream before capture_begin
  bool capturing = false, retained = false;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  // Undoes capture_begin's switch of stream.
  void restore() {
    if (previous) cuda::set_current_stream(*previous);
    previous.reset();
    capturing = false;
  }
};

CudaGraph::CudaGraph(int device) : impl_(std::make_unique<Impl>()) {
  TD_CHECK(cuda::device_count() > 0, "CudaGraph: no CUDA device is visible");
  impl_->device = device < 0 ? cuda::current_device() : device;
  TD_CHECK(impl_->device < cuda::device_count(), "CudaGraph: CUDA device ", impl_->device,
           " does not exist (", cuda::device_count(), " visible)");
}

CudaGraph::~CudaGraph() {
  cuda::DeviceGuard guard(impl_->device);
  if (impl_->capturing && impl_->capture) {
    cudaGraph_t g = nullptr;
    (void)cudaStreamEndCapture(impl_->capture->handle(), &g);
    if (g != nullptr) cudaGraphDestroy(g);
    impl_->restore();
  }
  if (impl_->exec != nullptr) cudaGraphExecDestroy(impl_->exec);
  if (impl_->graph != nullptr) cudaGraphDestroy(impl_->graph);
  if (impl_->retained && impl_->capture) {
    try {
      cuda::caching_allocator(impl_->device).release_stream(impl_->capture->id());
    } catch (...) {  // a destructor must not throw
    }
  }
}

void CudaGraph::capture_begin() {
  Impl& g = *impl_;
  TD_CHECK(!g.capturing, "CudaGraph.capture_begin: a capture is already in progress");
  TD_CHECK(g.exec == nullptr,
           "CudaGraph.capture_begin: this graph was already captured (make a "
           "new CudaGraph to capture again)");
  cuda::DeviceGuard guard(g.device);
  const cuda::Stream current = cuda::current_stream(g.device);
  g.capture = cuda::Stream::create(g.device, /*non_blocking=*/true);
  // The capture's first kernels come after everything queued so far on the current stream.
  cuda::Event ready;
  ready.record(current);
  g.capture->wait(ready);
  cuda::caching_allocator(g.device).retain_stream(g.capture->id());
  g.retained = true;
  g.previous = current;
  cuda::set_current_stream(*g.capture);
  g.capturing = true;
  const cudaError_t rc =
      cudaStreamBeginCapture(g.capture->handle(), cudaStreamCaptureModeThreadLocal);
  if (rc != cudaSuccess) {
    g.restore();
    TD_CUDA_CHECK(rc);
  }
}

void CudaGraph::capture_end() {
  Impl& g = *impl_;
  TD_CHECK(g.capturing, "CudaGraph.capture_end: no capture in progress (call capture_begin)");
  cuda::DeviceGuard guard(g.device);
  cudaGraph_t graph = nullptr;
  const cudaError_t rc = cudaStreamEndCapture(g.capture->handle(), &graph);
  g.restore();
  if (rc != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    TD_ERROR("CudaGraph.capture_end: the capture failed: ", cudaGetErrorName(rc), " (",
             cudaGetErrorString(rc),
             "); an operation in it waited for the device (item(), to('cpu'), a blocking "
             "collective) or used another stream without an event (Note [CUDA graphs])");
  }
  g.graph = graph;
  TD_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
}

void CudaGraph::replay() {
  Impl& g = *impl_;
  TD_CHECK(g.exec != nullptr, "CudaGraph.replay: nothing captured (capture_begin / capture_end)");
  cuda::DeviceGuard guard(g.device);
  TD_CUDA_CHECK(cudaGraphLaunch(g.exec, cuda::current_stream(g.device).handle()));
}

bool CudaGraph::ready() const {
  return impl_->exec != nullptr;
}

int CudaGraph::device() const {
  return impl_->device;
}

}  // namespace td
