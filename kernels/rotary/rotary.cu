#include "common/cuda_types.cuh"
#include "rotary/rotary.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {

namespace {

constexpr int kThreads = 256;

// Item q = r * half + i: row r = ((b * S) + t) * H + h, pair i.
template <typename T>
__global__ void rotary_kernel(const T* __restrict__ x, RotaryShape sh, const float* __restrict__ cs,
                              const float* __restrict__ sn, float sign, T* __restrict__ out) {
  const int64_t half = sh.head_dim / 2;
  const int64_t rows = sh.batch * sh.seq * sh.heads;
  const int64_t total = rows * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < total;
       q += stride) {
    const int64_t r = q / half, i = q - r * half;
    const int64_t h = r % sh.heads, t = (r / sh.heads) % sh.seq, b = r / (sh.heads * sh.seq);
    const T* xr = x + b * sh.stride[0] + t * sh.stride[1] + h * sh.stride[2];
    const float x1 = to_float(xr[i * sh.stride[3]]);
    const float x2 = to_float(xr[(i + half) * sh.stride[3]]);
    const float c = cs[t * half + i];
    const float s = sign * sn[t * half + i];
    T* o = out + r * sh.head_dim;
    o[i] = from_float<T>(x1 * c - x2 * s);
    o[i + half] = from_float<T>(x2 * c + x1 * s);
  }
}

}  // namespace

template <typename T>
void rotary_forward(const T* x, const RotaryShape& shape, const float* cos, const float* sin,
                    bool inverse, T* out, cudaStream_t stream) {
  const int64_t total = shape.batch * shape.seq * shape.heads * (shape.head_dim / 2);
  if (total == 0) return;
  rotary_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, shape, cos, sin,
                                                                       inverse ? -1.0f : 1.0f, out);
  TD_CUDA_LAUNCH_CHECK();
}

#define TD_ROTARY_INSTANTIATE(T)                                                                  \
  template void rotary_forward<T>(const T*, const RotaryShape&, const float*, const float*, bool, \
                                  T*, cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_ROTARY_INSTANTIATE)

}  // namespace td::kernels
