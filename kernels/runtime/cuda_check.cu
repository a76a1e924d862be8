#include <cudnn.h>

#include "runtime/cuda_check.cuh"
#include "tardelli/core/error.h"

namespace td::cuda::detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Note [Clearing the error]: a non-sticky error also sits in the runtime's last-error slot;
  // clear it so that a later TD_CUDA_LAUNCH_CHECK does not report this failure twice. Sticky
  // errors (a faulting kernel) stay: the context is unusable and every later call says so.
  (void)cudaGetLastError();
  throw Error(::td::detail::str_cat("CUDA error ", cudaGetErrorName(err), " (",
                                    static_cast<int>(err), "): ", cudaGetErrorString(err), " [in ",
                                    call, " at ", file, ":", line, "]"));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(::td::detail::str_cat("cuBLAS error ", cublasGetStatusName(status), " (",
                                    static_cast<int>(status), "): ", cublasGetStatusString(status),
                                    " [in ", call, " at ", file, ":", line, "]"));
}

void throw_cudnn_error(int status, const char* call, const char* file, int line) {
  throw Error(::td::detail::str_cat("cuDNN error (", status,
                                    "): ", cudnnGetErrorString(static_cast<cudnnStatus_t>(status)),
                                    " [in ", call, " at ", file, ":", line, "]"));
}

}  // namespace td::cuda::detail
