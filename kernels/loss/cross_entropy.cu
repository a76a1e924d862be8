// Fused cross-entropy kernels. Note [Fused cross entropy] (src/ops/loss.cpp) is the
// specification.
//
// Note [CUDA cross entropy]: forward: one block per row reads the logits once (16-byte loads
// when aligned) with an online max / sum of exp per thread (Note [Row ownership]), combines
// them, and thread 0 forms the loss from log_s and one read of x[t]; only the fp32 shift and
// log_s per row are saved. A single-block kernel then sums the losses and counts the valid rows
// in a fixed order (deterministic) and reports the first out-of-range target, which the glue
// turns into the CPU backend's error. Backward: one block per row writes dx in one pass from
// the saved statistics (one read of the logits, one write).
#include <climits>

#include "loss/cross_entropy.cuh"
#include "runtime/cuda_check.cuh"
#include "softmax/row_common.cuh"

namespace td::kernels {

namespace {

constexpr int kMaxThreads = 512;

template <typename T>
__global__ void ce_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                  int64_t rows, int64_t C, int64_t ignore_index, float eps,
                                  float* loss, float* shift_out, float* log_s_out, bool vec) {
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * C;
    rows::OnlineMaxSum st;
    float sx = 0.f;
    int64_t cnt = 0;
    rows::for_each1(xr, C, vec, [&](int64_t, float v) {
      st.add(v);
      sx += v;
      ++cnt;
    });
    float sum = 0.f;
    const float shift = rows::block_softmax_stats(st, red, &sum);
    // sum_c (x[c] - shift), needed for label smoothing only (eps is uniform over the block).
    float sxs = 0.f;
    if (eps != 0.f) sxs = block_sum(sx - static_cast<float>(cnt) * shift, red);
    if (threadIdx.x == 0) {
      const float log_s = logf(sum);
      shift_out[r] = shift;
      log_s_out[r] = log_s;
      const int64_t t = target[r];
      float l = 0.f;
      if (t != ignore_index) {
        if (t < 0 || t >= C) {
          l = NAN;  // reported by cross_entropy_reduce
        } else {
          // lse - x[t] as log(s) - (x[t] - max): exact subtraction first (as the CPU).
          const float nll = log_s - (to_float(xr[t]) - shift);
          const float smooth = static_cast<float>(C) * log_s - sxs;
          l = eps == 0.f ? nll : (1.0f - eps) * nll + eps / static_cast<float>(C) * smooth;
        }
      }
      loss[r] = l;
    }
  }
}

constexpr int kReduceThreads = 1024;

template <typename T>
__global__ void ce_reduce_kernel(const float* __restrict__ loss, const int64_t* __restrict__ target,
                                 int64_t rows, int64_t C, int64_t ignore_index, bool mean, T* out,
                                 CrossEntropyTotals* totals) {
  __shared__ double s_tot[kReduceThreads / 32];
  __shared__ long long s_cnt[kReduceThreads / 32], s_bad[kReduceThreads / 32];
  double tot = 0.0;
  long long cnt = 0, bad = LLONG_MAX;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t t = target[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= C) {
      if (r < bad) bad = r;
      continue;
    }
    ++cnt;
    tot += static_cast<double>(loss[r]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    tot += __shfl_xor_sync(0xffffffffu, tot, o);
    cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    const long long ob = __shfl_xor_sync(0xffffffffu, bad, o);
    bad = ob < bad ? ob : bad;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s_tot[warp] = tot;
    s_cnt[warp] = cnt;
    s_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double t_all = 0.0;
    long long c_all = 0, b_all = LLONG_MAX;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
      t_all += s_tot[w];
      c_all += s_cnt[w];
      b_all = s_bad[w] < b_all ? s_bad[w] : b_all;
    }
    totals->total = t_all;
    totals->count = c_all;
    totals->bad_row = b_all == LLONG_MAX ? -1 : b_all;
    totals->bad_target = b_all == LLONG_MAX ? 0 : target[b_all];
    if (out != nullptr) {
      // Mean over zero rows: 0 / 0 = NaN, as the CPU.
      const double v = mean ? t_all / static_cast<double>(c_all) : t_all;
      out[0] = from_float<T>(static_cast<float>(v));
    }
  }
}

template <typename T>
__global__ void ce_backward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                   const float* __restrict__ shift, const float* __restrict__ log_s,
                                   const float* __restrict__ g, bool g_scalar, double scale,
                                   int64_t rows, int64_t C, int64_t ignore_index, float eps,
                                   T* __restrict__ dx, bool vec) {
  const float off = eps / static_cast<float>(C);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* dr = dx + r * C;
    const int64_t t = target[r];
    if (t == ignore_index || t < 0 || t >= C) {
      rows::map0(dr, C, vec, [](int64_t) { return 0.f; });
      continue;
    }
    const float gr = static_cast<float>(static_cast<double>(g[g_scalar ? 0 : r]) * scale);
    const float m = shift[r], ls = log_s[r], hit = (1.0f - eps) * gr;
    rows::map1(logits + r * C, dr, C, vec, [&](int64_t j, float v) {
      float o = (expf((v - m) - ls) - off) * gr;
      if (j == t) o -= hit;
      return o;
    });
  }
}

}  // namespace

template <typename T>
void cross_entropy_forward(const T* logits, const int64_t* target, int64_t rows, int64_t C,
                           int64_t ignore_index, float eps, float* loss, float* shift, float* log_s,
                           cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  const bool vec = rows::rows_vectorizable<T>(C, {logits});
  const int threads = rows::threads_for_row(C, vec ? kVec16<T> : 1, kMaxThreads);
  ce_forward_kernel<T><<<rows::row_blocks(rows), threads, 0, stream>>>(
      logits, target, rows, C, ignore_index, eps, loss, shift, log_s, vec);
  TD_CUDA_LAUNCH_CHECK();
}

template <typename T>
void cross_entropy_reduce(const float* loss, const int64_t* target, int64_t rows, int64_t C,
                          int64_t ignore_index, bool mean, T* out, CrossEntropyTotals* totals,
                          cudaStream_t stream) {
  ce_reduce_kernel<T>
      <<<1, kReduceThreads, 0, stream>>>(loss, target, rows, C, ignore_index, mean, out, totals);
  TD_CUDA_LAUNCH_CHECK();
}

template <typename T>
void cross_entropy_backward(const T* logits, const int64_t* target, const float* shift,
                            const float* log_s, const float* g, bool g_scalar, double scale,
                            int64_t rows, int64_t C, int64_t ignore_index, float eps, T* dx,
                            cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  const bool vec = rows::rows_vectorizable<T>(C, {logits, dx});
  const int threads = rows::threads_for_row(C, vec ? kVec16<T> : 1, kMaxThreads);
  ce_backward_kernel<T><<<rows::row_blocks(rows), threads, 0, stream>>>(
      logits, target, shift, log_s, g, g_scalar, scale, rows, C, ignore_index, eps, dx, vec);
  TD_CUDA_LAUNCH_CHECK();
}

#define TD_INSTANTIATE_CE(T)                                                                     \
  template void cross_entropy_forward<T>(const T*, const int64_t*, int64_t, int64_t, int64_t,    \
                                         float, float*, float*, float*, cudaStream_t);           \
  template void cross_entropy_reduce<T>(const float*, const int64_t*, int64_t, int64_t, int64_t, \
                                        bool, T*, CrossEntropyTotals*, cudaStream_t);            \
  template void cross_entropy_backward<T>(const T*, const int64_t*, const float*, const float*,  \
                                          const float*, bool, double, int64_t, int64_t, int64_t, \
                                          float, T*, cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_INSTANTIATE_CE)
#undef TD_INSTANTIATE_CE

}  // namespace td::kernels
