#pragma once
// Checks for every CUDA runtime, cuBLAS and cuDNN call: a failure becomes a td::Error naming the
// call, the source location, the error's name and its description.
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace td::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);
// cudnnStatus_t passed as int so this header does not pull in cudnn.h.
[[noreturn]] void throw_cudnn_error(int status, const char* call, const char* file, int line);

}  // namespace td::cuda::detail

// TD_CUDA_CHECK(call): throws td::Error if the cudaError_t that `call` returns is not cudaSuccess.
#define TD_CUDA_CHECK(call)                                                          \
  do {                                                                               \
    const cudaError_t td_cuda_err_ = (call);                                         \
    if (td_cuda_err_ != cudaSuccess) [[unlikely]] {                                  \
      ::td::cuda::detail::throw_cuda_error(td_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

// After a kernel launch (<<<...>>> returns nothing): reports a bad launch configuration.
#define TD_CUDA_LAUNCH_CHECK() TD_CUDA_CHECK(cudaGetLastError())

#define TD_CUBLAS_CHECK(call)                                                           \
  do {                                                                                  \
    const cublasStatus_t td_cublas_st_ = (call);                                        \
    if (td_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                          \
      ::td::cuda::detail::throw_cublas_error(td_cublas_st_, #call, __FILE__, __LINE__); \
    }                                                                                   \
  } while (0)

// Use with cudnn.h included: TD_CUDNN_CHECK(cudnnCreate(&h)).
#define TD_CUDNN_CHECK(call)                                                          \
  do {                                                                                \
    const int td_cudnn_st_ = static_cast<int>(call);                                  \
    if (td_cudnn_st_ != 0 /* CUDNN_STATUS_SUCCESS */) [[unlikely]] {                  \
      ::td::cuda::detail::throw_cudnn_error(td_cudnn_st_, #call, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)
