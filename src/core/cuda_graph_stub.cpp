// td::CudaGraph in a build without the CUDA backend (the CUDA build defines it in
// kernels/runtime/cuda_graph.cu): constructing one is an error.
#include "tardelli/core/cuda_graph.h"

#if !TD_WITH_CUDA
#include "tardelli/core/error.h"

namespace td {

struct CudaGraph::Impl {};

CudaGraph::CudaGraph(int device) {
  TD_ERROR("CudaGraph(cuda:", device,
           "): this build of tardelli has no CUDA backend (configure with -DTD_WITH_CUDA=ON)");
}
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture_begin() {}
void CudaGraph::capture_end() {}
void CudaGraph::replay() {}
bool CudaGraph::ready() const {
  return false;
}
int CudaGraph::device() const {
  return -1;
}

}  // namespace td
#endif  // !TD_WITH_CUDA
