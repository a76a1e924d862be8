#pragma once
// Multi-tensor optimizer updates and the gradient-norm partials of clip_grad_norm_
// (src/ops/adamw.cpp, src/optim/sgd.cpp and src/optim/clip_grad.cpp are the specifications).
//
// Note [Multi-tensor launches]: the caller cuts every tensor of a list into chunks of at most
// kOptimChunk elements and describes each chunk by its own pointers (already offset to the
// chunk's start) and length. The descriptors are copied to device memory and one launch runs
// one block per chunk, so a list of hundreds of small tensors (biases, norms) costs one launch
// and the blocks are evenly loaded. Full groups of four elements are loaded as vectors when all
// of a chunk's pointers are aligned for it (chunk starts are multiples of kOptimChunk, so a
// tensor whose start is aligned gives aligned chunks); the tail is scalar.
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

inline constexpr int64_t kOptimChunk = 65536;

// ---- AdamW ----
// Per-step scalars formed on the host in double (Note [AdamW order of operations]):
//   p = p * decay;  m += one_minus_b1 * (g - m);  v = b2 * v + one_minus_b2 * g * g
//   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
struct AdamWCoeffs {
  float decay, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps;
};
// p: TP (float, __nv_bfloat16, __half), g: TP or float, m and v: float.
struct AdamWChunk {
  void* p;
  const void* g;
  float* m;
  float* v;
  int64_t n;
};
// Copies the num_chunks descriptors of `host_chunks` to `device_chunks` (device memory of
// num_chunks descriptors) and updates every chunk in one launch.
template <typename TP, typename TG>
void adamw_multi_tensor(const AdamWChunk* host_chunks, int64_t num_chunks,
                        AdamWChunk* device_chunks, const AdamWCoeffs& c, cudaStream_t stream);

// The same update with descriptors already in device memory and the coefficients read from
// device memory (Note [Capturable AdamW] in src/ops/adamw.cpp): no host-to-device copy, so a
// CUDA graph can capture it and replays use the coefficients of the replay's step.
template <typename TP, typename TG>
void adamw_multi_tensor_device(const AdamWChunk* device_chunks, int64_t num_chunks,
                               const AdamWCoeffs* device_coeffs, cudaStream_t stream);

// ---- SGD (torch.optim.SGD) ----
//   d = g (+ weight_decay * p);  with momentum: buf = first ? d : momentum * buf +
//   one_minus_dampening * d;  d = nesterov ? d + momentum * buf : buf;  p -= lr * d
struct SGDCoeffs {
  float lr, weight_decay, momentum, one_minus_dampening;
  int nesterov;
};
struct SGDChunk {
  void* p;
  const void* g;
  float* buf;  // nullptr without momentum
  int64_t n;
  int first;  // the momentum buffer is initialized from d
};
template <typename TP, typename TG>
void sgd_multi_tensor(const SGDChunk* host_chunks, int64_t num_chunks, SGDChunk* device_chunks,
                      const SGDCoeffs& c, cudaStream_t stream);

// ---- Gradient norm partials ----
// kind: 1 (sum |x|), 2 (sum x^2), 0 (max |x|, NaN-propagating), 3 (sum |x|^p). Each chunk's
// value is reduced in double with a fixed tree and written to partials[slot]; the caller
// combines the partials in slot order on the host, so the result is deterministic.
struct NormChunk {
  const void* x;
  int64_t n;
  int64_t slot;
};
template <typename T>
void grad_norm_partials(const NormChunk* host_chunks, int64_t num_chunks, NormChunk* device_chunks,
                        int kind, double p, double* partials, cudaStream_t stream);

}  // namespace td::kernels
