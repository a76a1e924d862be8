#pragma once
// The register-row kernels of layer_norm / rms_norm (Note [CUDA norm kernels] in norm.cu, Note
// [Register rows] in softmax/row_registers.cuh). Device code included by norm.cu only.
#include "softmax/row_registers.cuh"

namespace td::kernels::norm_regs {

// Warps per block of the forward warp path (one row per warp).
inline constexpr int kForwardWarps = 4;
// Warps per block of the backward warp path (one weight-gradient chunk per block).
inline constexpr int kBackwardWarps = 8;
// Largest block of the forward / backward block path.
inline constexpr int kForwardMaxThreads = 512;
inline constexpr int kBackwardMaxThreads = 256;

// The backward holds, per thread, E = kVecs * V elements of each of g and x for every row in
// flight plus the 2 * E column sums: the warp path takes rows of up to E = 32 (1024 elements),
// two rows at once while E <= 24; the block path uses E = 16 (kBackwardBlockVecs vectors) and one
// row at a time, small enough for two blocks of 256 threads per SM.
template <typename T>
inline constexpr int kBackwardBlockVecs = 16 / kVec16<T>;
template <typename T>
inline constexpr int kBackwardMaxWarpVecs = 32 / kVec16<T>;
template <typename T, int kVecs, bool kWarp>
inline constexpr int kBackwardRows = kWarp&& kVecs* kVec16<T> <= 24 ? 2 : 1;

// y = (x - mean) * rstd * w + b for each row a group owns, the row held in registers; statistics
// as Note [Corrected two-pass statistics] (src/ops/norm.cpp): mean, then the centred sums of d
// and d^2 in one reduction.
template <typename T, bool kLayer, int kVecs, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kForwardWarps * 32 : kForwardMaxThreads)
    forward_kernel(const T* __restrict__ x, T* __restrict__ y, float* __restrict__ mean,
                   float* __restrict__ rstd, const float* __restrict__ w,
                   const float* __restrict__ b, int64_t rows, int n, float eps) {
  constexpr int V = kVec16<T>;
  __shared__ float red[2 * 32];
  const rows::Group<kWarp> grp;
  const int nv = n / V;
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t r = grp.first; r < rows; r += grp.step) {
    float v[kVecs][V];
    rows::load_row<T, kVecs>(x + r * n, nv, grp, v, 0.f);
    float mu = 0.f;
    if constexpr (kLayer) {
      float s[1] = {0.f};
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
#pragma unroll
        for (int e = 0; e < V; ++e) s[0] += v[k][e];  // not owned: 0
      }
      rows::group_reduce<kWarp, false>(s, red);
      mu = s[0] * inv_n;
    }
    // t[0] = sum d^2 and (layer) t[1] = sum d, with d = x - mu.
    float t[kLayer ? 2 : 1];
#pragma unroll
    for (int i = 0; i < (kLayer ? 2 : 1); ++i) t[i] = 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!grp.owns(k, nv)) continue;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = v[k][e] - mu;
        t[0] += d * d;
        if constexpr (kLayer) t[1] += d;
      }
    }
    rows::group_reduce<kWarp, false>(t, red);
    float ss = t[0];
    if constexpr (kLayer) {  // Note [Corrected two-pass statistics] (src/ops/norm.cpp)
      const float c = t[1] * inv_n;
      mu += c;
      ss = fmaxf(0.f, ss - c * t[1]);
    }
    const float rs = 1.0f / sqrtf(ss * inv_n + eps);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!grp.owns(k, nv)) continue;
      const int64_t j0 = static_cast<int64_t>(grp.vec_index(k)) * V;
      float wk[V], bk[V];
      if (w != nullptr) rows::load_floats<V>(w + j0, wk);
      if (b != nullptr) rows::load_floats<V>(b + j0, bk);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        float o = (v[k][e] - mu) * rs;
        if (w != nullptr) o *= wk[e];
        if (b != nullptr) o += bk[e];
        v[k][e] = o;
      }
    }
    rows::store_row<T, kVecs>(y + r * n, nv, grp, v);
    if (grp.lane == 0) {
      if constexpr (kLayer) mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

// One weight-gradient chunk per block (rows [c * chunk_rows, ...) of chunk c = blockIdx.x):
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) (rms: without mean(gw)), gw = g * w, for
// every row of the chunk, g and x read once. Each thread adds g * xhat and g of the columns it
// owns into registers, over its group's rows in order; the warp path then adds its warps' sums in
// warp order through shared memory. The chunk's partials go to pw / pb [nchunks, n] (either may be
// null).
template <typename T, bool kLayer, int kVecs, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kBackwardWarps * 32 : kBackwardMaxThreads, kWarp ? 1 : 2)
    backward_kernel(const T* __restrict__ g, const T* __restrict__ x,
                    const float* __restrict__ mean, const float* __restrict__ rstd,
                    const float* __restrict__ w, T* __restrict__ dx, float* __restrict__ pw,
                    float* __restrict__ pb, int64_t rows, int n, int64_t chunk_rows) {
  constexpr int V = kVec16<T>;
  constexpr int R = kBackwardRows<T, kVecs, kWarp>;
  __shared__ float red[2 * R * 32];
  const int nv = n / V;
  const float inv_n = 1.0f / static_cast<float>(n);
  // Group (warp or block) within the block and the rows it takes: R at a time, in order.
  const int lane = kWarp ? static_cast<int>(threadIdx.x & 31) : static_cast<int>(threadIdx.x);
  const int width = kWarp ? 32 : static_cast<int>(blockDim.x);
  const int group = kWarp ? static_cast<int>(threadIdx.x >> 5) : 0;
  const int groups = kWarp ? static_cast<int>(blockDim.x >> 5) : 1;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  auto owns = [&](int k) { return lane + k * width < nv; };
  auto col0 = [&](int k) { return static_cast<int64_t>(lane + k * width) * V; };

  float aw[kVecs][V], ab[kVecs][V];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
#pragma unroll
    for (int e = 0; e < V; ++e) aw[k][e] = ab[k][e] = 0.f;
  }
  // The block path's loop runs the same trips in every thread (it holds __syncthreads).
  for (int64_t base = r0 + static_cast<int64_t>(group) * R; base < r1;
       base += static_cast<int64_t>(groups) * R) {
    rows::Vec16<T> gv[R][kVecs], xv[R][kVecs];
    float mu[R], rs[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = base + i;
      const bool live = r < r1;
      mu[i] = kLayer && live ? mean[r] : 0.f;
      rs[i] = live ? rstd[r] : 0.f;
      const auto* gr = reinterpret_cast<const rows::Vec16<T>*>(g + r * n);
      const auto* xr = reinterpret_cast<const rows::Vec16<T>*>(x + r * n);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        if (live && owns(k)) {
          gv[i][k] = gr[lane + k * width];
          xv[i][k] = xr[lane + k * width];
        }
      }
    }
    // s[2i] = sum gw, s[2i + 1] = sum gw * xhat of row base + i. gw is rounded before use in
    // both passes (__fmul_rn is never contracted into an FMA), so gw - mean(gw) cancels exactly
    // where it should (a one-element row gives dx = 0).
    float s[2 * R];
#pragma unroll
    for (int i = 0; i < 2 * R; ++i) s[i] = 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!owns(k)) continue;
      float wk[V];
      if (w != nullptr) rows::load_floats<V>(w + col0(k), wk);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (base + i >= r1) continue;
        float gf[V], xf[V];
        rows::to_floats<T>(gv[i][k], gf);
        rows::to_floats<T>(xv[i][k], xf);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float xh = (xf[e] - mu[i]) * rs[i];
          const float gw = w != nullptr ? __fmul_rn(gf[e], wk[e]) : gf[e];
          s[2 * i] += gw;
          s[2 * i + 1] += gw * xh;
        }
      }
    }
    rows::group_reduce<kWarp, false>(s, red);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!owns(k)) continue;
      float wk[V];
      if (w != nullptr) rows::load_floats<V>(w + col0(k), wk);
#pragma unroll
      for (int i = 0; i < R; ++i) {  // rows in order: the column sums keep row order
        const int64_t r = base + i;
        if (r >= r1) continue;
        const float a = kLayer ? s[2 * i] * inv_n : 0.f, bc = s[2 * i + 1] * inv_n;
        float gf[V], xf[V];
        rows::to_floats<T>(gv[i][k], gf);
        rows::to_floats<T>(xv[i][k], xf);
        rows::Vec16<T> o;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float xh = (xf[e] - mu[i]) * rs[i];
          const float gw = w != nullptr ? __fmul_rn(gf[e], wk[e]) : gf[e];
          aw[k][e] += gf[e] * xh;
          ab[k][e] += gf[e];
          o.v[e] = from_float<T>(rs[i] * (gw - a - xh * bc));
        }
        reinterpret_cast<rows::Vec16<T>*>(dx + r * n)[lane + k * width] = o;
      }
    }
  }
  if (pw == nullptr && pb == nullptr) return;
  float* part[2] = {pw, pb};
  const int64_t out0 = static_cast<int64_t>(blockIdx.x) * n;
  if constexpr (!kWarp) {  // every column has one owner in the block
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (!owns(k)) continue;
      if (pw != nullptr) rows::store_floats<V>(pw + out0 + col0(k), aw[k]);
      if (pb != nullptr) rows::store_floats<V>(pb + out0 + col0(k), ab[k]);
    }
  } else {
    // The warps' sums of vector k (32 * V columns) are staged in shared memory and added in
    // warp order by one thread per column.
    __shared__ float stage[kBackwardWarps][32 * V];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (part[q] == nullptr) continue;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        __syncthreads();  // the previous round's reads are done
#pragma unroll
        for (int e = 0; e < V; ++e) stage[group][lane * V + e] = q == 0 ? aw[k][e] : ab[k][e];
        __syncthreads();
        const int c = static_cast<int>(threadIdx.x);
        const int64_t col = static_cast<int64_t>(k) * 32 * V + c;
        if (c < 32 * V && col < n) {
          float t = stage[0][c];
          for (int m = 1; m < groups; ++m) t += stage[m][c];
          part[q][out0 + col] = t;
        }
      }
    }
  }
}

}  // namespace td::kernels::norm_regs
