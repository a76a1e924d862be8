// Activation kernels: one grid-stride pass, 16-byte vectors when every pointer is aligned (the
// tail that is not a whole vector, or a misaligned array, goes element by element), fp32 math,
// rounded once on store. The formulas are the CPU's (Note [Activation numerics]).
#include "activation/activation.cuh"
#include "common/cuda_types.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluCoeff = 0.044715f;
constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid_f(float v) {
  return 1.0f / (1.0f + expf(-v));
}

template <ActivationOp kOp>
__device__ __forceinline__ float act_fwd(float x) {
  if constexpr (kOp == ActivationOp::GeluErf) {
    return 0.5f * x * erfcf(-x * kInvSqrt2);
  } else if constexpr (kOp == ActivationOp::GeluTanh) {
    const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
    return x * sigmoid_f(2.0f * u);
  } else if constexpr (kOp == ActivationOp::Silu) {
    return x * sigmoid_f(x);
  } else {
    return x < 0.0f ? 0.0f : x;  // NaN stays NaN
  }
}

template <ActivationOp kOp>
__device__ __forceinline__ float act_bwd(float g, float x) {
  if constexpr (kOp == ActivationOp::GeluErf) {
    return g * (0.5f * erfcf(-x * kInvSqrt2) + x * kInvSqrt2Pi * expf(-0.5f * x * x));
  } else if constexpr (kOp == ActivationOp::GeluTanh) {
    const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
    const float s = sigmoid_f(2.0f * u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
    return g * (s + 2.0f * x * s * (1.0f - s) * du);
  } else if constexpr (kOp == ActivationOp::Silu) {
    const float s = sigmoid_f(x);
    return g * s * (1.0f + x * (1.0f - s));
  } else {
    return x > 0.0f ? g : 0.0f;  // x is relu's output
  }
}

template <typename T, ActivationOp kOp>
__global__ void act_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                   bool vec) {
  constexpr int V = kVec16<T>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t nv = vec ? n / V : 0;
  const auto* xv = reinterpret_cast<const Vec<T, V>*>(x);
  auto* yv = reinterpret_cast<Vec<T, V>*>(y);
  for (int64_t i = tid; i < nv; i += stride) {
    const Vec<T, V> a = xv[i];
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(act_fwd<kOp>(to_float(a.v[k])));
    yv[i] = o;
  }
  for (int64_t j = nv * V + tid; j < n; j += stride) {
    y[j] = from_float<T>(act_fwd<kOp>(to_float(x[j])));
  }
}

template <typename T, ActivationOp kOp>
__global__ void act_backward_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                    T* __restrict__ dx, int64_t n, bool vec) {
  constexpr int V = kVec16<T>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t nv = vec ? n / V : 0;
  const auto* gv = reinterpret_cast<const Vec<T, V>*>(g);
  const auto* xv = reinterpret_cast<const Vec<T, V>*>(x);
  auto* ov = reinterpret_cast<Vec<T, V>*>(dx);
  for (int64_t i = tid; i < nv; i += stride) {
    const Vec<T, V> a = gv[i], b = xv[i];
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      o.v[k] = from_float<T>(act_bwd<kOp>(to_float(a.v[k]), to_float(b.v[k])));
    }
    ov[i] = o;
  }
  for (int64_t j = nv * V + tid; j < n; j += stride) {
    dx[j] = from_float<T>(act_bwd<kOp>(to_float(g[j]), to_float(x[j])));
  }
}

// Blocks for n elements processed V at a time.
template <typename T>
unsigned act_grid(int64_t n, bool vec) {
  return grid_for(vec ? ceil_div(n, kVec16<T>) : n, kThreads);
}

template <typename T, ActivationOp kOp>
void launch_forward(const T* x, T* y, int64_t n, cudaStream_t stream) {
  const bool vec = is_aligned<16>(x) && is_aligned<16>(y);
  act_forward_kernel<T, kOp><<<act_grid<T>(n, vec), kThreads, 0, stream>>>(x, y, n, vec);
  TD_CUDA_LAUNCH_CHECK();
}

template <typename T, ActivationOp kOp>
void launch_backward(const T* g, const T* x, T* dx, int64_t n, cudaStream_t stream) {
  const bool vec = is_aligned<16>(g) && is_aligned<16>(x) && is_aligned<16>(dx);
  act_backward_kernel<T, kOp><<<act_grid<T>(n, vec), kThreads, 0, stream>>>(g, x, dx, n, vec);
  TD_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename T>
void activation_forward(ActivationOp op, const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  switch (op) {
    case ActivationOp::GeluErf:
      return launch_forward<T, ActivationOp::GeluErf>(x, y, n, stream);
    case ActivationOp::GeluTanh:
      return launch_forward<T, ActivationOp::GeluTanh>(x, y, n, stream);
    case ActivationOp::Silu:
      return launch_forward<T, ActivationOp::Silu>(x, y, n, stream);
    case ActivationOp::Relu:
      return launch_forward<T, ActivationOp::Relu>(x, y, n, stream);
  }
}

template <typename T>
void activation_backward(ActivationOp op, const T* g, const T* x, T* dx, int64_t n,
                         cudaStream_t stream) {
  if (n <= 0) return;
  switch (op) {
    case ActivationOp::GeluErf:
      return launch_backward<T, ActivationOp::GeluErf>(g, x, dx, n, stream);
    case ActivationOp::GeluTanh:
      return launch_backward<T, ActivationOp::GeluTanh>(g, x, dx, n, stream);
    case ActivationOp::Silu:
      return launch_backward<T, ActivationOp::Silu>(g, x, dx, n, stream);
    case ActivationOp::Relu:
      return launch_backward<T, ActivationOp::Relu>(g, x, dx, n, stream);
  }
}

#define TD_INSTANTIATE_ACTIVATION(T)                                                      \
  template void activation_forward<T>(ActivationOp, const T*, T*, int64_t, cudaStream_t); \
  template void activation_backward<T>(ActivationOp, const T*, const T*, T*, int64_t, cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_INSTANTIATE_ACTIVATION)
#undef TD_INSTANTIATE_ACTIVATION

}  // namespace td::kernels
