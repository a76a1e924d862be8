// layer_norm / rms_norm kernels. Note [Fused norms] (src/ops/norm.cpp) is the specification.
//
// Note [CUDA norm kernels]: the fast paths hold rows in registers (Note [Register rows] in
// softmax/row_registers.cuh, kernels in norm_registers.cuh). Forward: a warp per row (four rows a
// block) for rows of up to 32 * 8 vectors (1024 fp32, 2048 bf16 elements), else a block of 128 to
// 512 threads per row, 4 vectors a thread (8192 fp32, 16384 bf16): each thread issues all its
// 16-byte loads at once, then the mean and the centred sums of d and d^2 (Note [Corrected two-pass
// statistics]) are two group reductions over registers, and y is stored. Backward: one block per
// weight-gradient chunk (the chunking depends only on rows and n: up to 64 rows a chunk while that
// leaves 128 chunks). Each group (a warp taking rows of up to 32 elements a lane, two rows at once
// when they fit; else the block, 16 elements a thread) loads g and x of its rows once, forms the
// two row sums in one reduction, writes dx and adds g * xhat and g into per-thread registers for
// the columns it owns, rows in order. At the chunk's end the warp path adds its warps' sums in warp
// order through shared memory; each chunk writes its partials to scratch [nchunks, n] and
// sum_chunks_kernel adds the chunks in order (in double), staging them in shared memory so many
// loads are in flight. Unaligned rows (n not a multiple of the vector, or offset pointers) and rows
// longer than the register paths take the fallback: forward one block per row with an fp32
// shared-memory copy of the row (rows up to kCacheBytes; longer rows are re-read, from L2);
// backward per-column shared accumulators, or for rows too long for those a column-tiled partials
// kernel (a second read of g and x), with the same chunks. No atomics: bitwise deterministic.
#include "norm/norm.cuh"
#include "norm/norm_registers.cuh"
#include "runtime/cuda_check.cuh"
#include "softmax/row_common.cuh"

namespace td::kernels {

namespace {

constexpr int kMaxThreads = 512;
// Dynamic shared memory usable without opting in (48 KiB less the static reduction buffers).
constexpr size_t kDefaultSmem = 47 * 1024;
// Largest shared accumulator of the fused backward (needs the opt-in above 48 KiB).
constexpr size_t kMaxAccumSmem = 100 * 1024;
constexpr size_t kCacheBytes = kDefaultSmem;

template <typename T, bool kLayer, bool kCache>
__global__ void norm_forward_kernel(const T* __restrict__ x, T* __restrict__ y, float* mean,
                                    float* rstd, const float* __restrict__ w,
                                    const float* __restrict__ b, int64_t rows, int64_t n, float eps,
                                    bool vec) {
  extern __shared__ float cache[];
  __shared__ float red[32];
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    float s = 0.f;
    rows::for_each1(xr, n, vec, [&](int64_t j, float v) {
      if constexpr (kCache) cache[j] = v;
      if constexpr (kLayer) s += v;
    });
    float mu = 0.f;
    if constexpr (kLayer) mu = block_sum(s, red) * inv_n;
    float ss = 0.f, sd = 0.f;
    if constexpr (kCache) {
      rows::for_owned<T>(n, vec, [&](int64_t j) {
        const float d = cache[j] - mu;
        sd += d;
        ss += d * d;
      });
    } else {
      rows::for_each1(xr, n, vec, [&](int64_t, float v) {
        const float d = v - mu;
        sd += d;
        ss += d * d;
      });
    }
    ss = block_sum(ss, red);
    if constexpr (kLayer) {  // Note [Corrected two-pass statistics] (src/ops/norm.cpp)
      sd = block_sum(sd, red);
      const float c = sd * inv_n;
      mu += c;
      ss = fmaxf(0.f, ss - c * sd);
    }
    const float rs = 1.0f / sqrtf(ss * inv_n + eps);
    auto out = [&](int64_t j, float v) {
      float o = (v - mu) * rs;
      if (w != nullptr) o *= w[j];
      if (b != nullptr) o += b[j];
      return o;
    };
    if constexpr (kCache) {
      rows::map0(yr, n, vec, [&](int64_t j) { return out(j, cache[j]); });
    } else {
      rows::map1(xr, yr, n, vec, out);
    }
    if (threadIdx.x == 0) {
      if constexpr (kLayer) mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

// Rows of the weight-gradient chunks (Note [CUDA norm kernels]): up to 64 rows a chunk while that
// leaves at least 128 chunks, at most 4096 chunks and 2^22 partial values per gradient; depends
// only on rows and n.
struct Chunking {
  int64_t chunk_rows = 1, nchunks = 0;
};
Chunking chunking(int64_t rows, int64_t n) {
  int64_t max_chunks = (int64_t{1} << 22) / (n < 1 ? 1 : n);
  if (max_chunks < 1) max_chunks = 1;
  if (max_chunks > 4096) max_chunks = 4096;
  Chunking c;
  c.chunk_rows = rows / 128;
  if (c.chunk_rows > 64) c.chunk_rows = 64;
  if (c.chunk_rows < 1) c.chunk_rows = 1;
  if (rows > 0 && ceil_div(rows, c.chunk_rows) > max_chunks)
    c.chunk_rows = ceil_div(rows, max_chunks);
  c.nchunks = rows < 1 ? 0 : ceil_div(rows, c.chunk_rows);
  return c;
}

// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) (rms: without mean(gw)), gw = g * w.
// kAccum: the block's chunk partials of dw / db (pw / pb, either may be null) via shared memory.
template <typename T, bool kLayer, bool kAccum>
__global__ void norm_backward_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                     const float* __restrict__ mean, const float* __restrict__ rstd,
                                     const float* __restrict__ w, T* __restrict__ dx, float* pw,
                                     float* pb, int64_t rows, int64_t n, int64_t chunk_rows,
                                     int64_t nchunks, bool vec) {
  extern __shared__ float acc[];
  __shared__ float red[32];
  float* acc_w = kAccum && pw != nullptr ? acc : nullptr;
  float* acc_b = kAccum && pb != nullptr ? acc + (pw != nullptr ? n : 0) : nullptr;
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    if constexpr (kAccum) {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        if (acc_w != nullptr) acc_w[j] = 0.f;
        if (acc_b != nullptr) acc_b[j] = 0.f;
      }
      __syncthreads();
    }
    const int64_t r_end = (c + 1) * chunk_rows < rows ? (c + 1) * chunk_rows : rows;
    for (int64_t r = c * chunk_rows; r < r_end; ++r) {
      const T* gr = g + r * n;
      const T* xr = x + r * n;
      const float mu = kLayer ? mean[r] : 0.f, rs = rstd[r];
      float s_gw = 0.f, s_gwx = 0.f;
      // gw is rounded before use in both passes (__fmul_rn is never contracted into an FMA), so
      // gw - mean(gw) cancels exactly where it should (a one-element row gives dx = 0).
      rows::for_each2(gr, xr, n, vec, [&](int64_t j, float gv, float xv) {
        const float xh = (xv - mu) * rs;
        const float gw = w != nullptr ? __fmul_rn(gv, w[j]) : gv;
        s_gw += gw;
        s_gwx += gw * xh;
      });
      if constexpr (kLayer) s_gw = block_sum(s_gw, red);
      s_gwx = block_sum(s_gwx, red);
      const float a = kLayer ? s_gw * inv_n : 0.f, bc = s_gwx * inv_n;
      rows::map2(gr, xr, dx + r * n, n, vec, [&](int64_t j, float gv, float xv) {
        const float xh = (xv - mu) * rs;
        const float gw = w != nullptr ? __fmul_rn(gv, w[j]) : gv;
        if constexpr (kAccum) {
          if (acc_w != nullptr) acc_w[j] += gv * xh;
          if (acc_b != nullptr) acc_b[j] += gv;
        }
        return rs * (gw - a - xh * bc);
      });
    }
    if constexpr (kAccum) {
      __syncthreads();
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        if (acc_w != nullptr) pw[c * n + j] = acc_w[j];
        if (acc_b != nullptr) pb[c * n + j] = acc_b[j];
      }
    }
  }
}

// Partials for rows too long for the shared accumulators: block (32, 8) covers 32 columns of
// one chunk (blockIdx.y); thread (tx, ty) sums rows ty, ty + 8, ... of the chunk in order, then
// the 8 row phases are added in order.
template <typename T, bool kLayer>
__global__ void norm_weight_partials_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                            const float* __restrict__ mean,
                                            const float* __restrict__ rstd, float* pw, float* pb,
                                            int64_t rows, int64_t n, int64_t chunk_rows) {
  __shared__ float sw[8][33], sb[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  const int64_t c = blockIdx.y;
  const int64_t r0 = c * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float aw = 0.f, ab = 0.f;
  if (col < n) {
    for (int64_t r = r0 + ty; r < r1; r += 8) {
      const float gv = to_float(g[r * n + col]);
      const float xh = (to_float(x[r * n + col]) - (kLayer ? mean[r] : 0.f)) * rstd[r];
      aw += gv * xh;
      ab += gv;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && col < n) {
    float tw = 0.f, tb = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      tw += sw[k][tx];
      tb += sb[k][tx];
    }
    if (pw != nullptr) pw[c * n + col] = tw;
    if (pb != nullptr) pb[c * n + col] = tb;
  }
}

// out[j] = sum over chunks c in order of part[c, j] (in double, rounded once), for the gradient
// blockIdx.y (parts / outs [0] = dw, [1] = db). A block takes kSumCols columns: all its threads
// stage the partials of kSumChunks chunks at a time in shared memory (many loads in flight), then
// one thread per column adds them in chunk order.
constexpr int kSumCols = 32, kSumChunks = 64, kSumThreads = 256;
__global__ void __launch_bounds__(kSumThreads)
    sum_chunks_kernel(const float* part0, const float* part1, float* out0, float* out1,
                      int64_t nchunks, int64_t n) {
  __shared__ float stage[kSumChunks][kSumCols];
  const float* part = blockIdx.y == 0 ? part0 : part1;
  float* out = blockIdx.y == 0 ? out0 : out1;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kSumCols;
  double s = 0.0;
  for (int64_t c0 = 0; c0 < nchunks; c0 += kSumChunks) {
    __syncthreads();  // the previous slab is added
    for (int i = static_cast<int>(threadIdx.x); i < kSumChunks * kSumCols; i += blockDim.x) {
      const int64_t c = c0 + i / kSumCols, j = j0 + i % kSumCols;
      stage[i / kSumCols][i % kSumCols] = c < nchunks && j < n ? part[c * n + j] : 0.f;
    }
    __syncthreads();
    if (threadIdx.x < kSumCols) {
      const int64_t m = nchunks - c0 < kSumChunks ? nchunks - c0 : kSumChunks;
      for (int64_t c = 0; c < m; ++c) s += stage[c][threadIdx.x];
    }
  }
  if (threadIdx.x < kSumCols && j0 + threadIdx.x < n) out[j0 + threadIdx.x] = static_cast<float>(s);
}

// The largest dynamic shared memory a block of the current device may opt into.
size_t max_dynamic_smem() {
  int dev = 0, optin = 0;
  TD_CUDA_CHECK(cudaGetDevice(&dev));
  TD_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const size_t limit = optin > 1024 ? static_cast<size_t>(optin) - 1024 : 0;
  return limit < kMaxAccumSmem ? limit : kMaxAccumSmem;
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultSmem) {
    TD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  }
}

template <typename T, bool kLayer>
void launch_forward(const T* x, T* y, float* mean, float* rstd, const float* w, const float* b,
                    int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  const bool vec = rows::rows_vectorizable<T>(n, {x, y, w, b});
  const int64_t nv = n / kVec16<T>;
  const int ni = static_cast<int>(n);
  if (vec && rows::warp_vecs(nv) > 0) {  // a warp per row
    constexpr int kRowsPerBlock = norm_regs::kForwardWarps;
    const unsigned grid = rows::row_blocks(ceil_div(rows, kRowsPerBlock));
    rows::with_warp_vecs(rows::warp_vecs(nv), [&](auto k) {
      norm_regs::forward_kernel<T, kLayer, decltype(k)::value, true>
          <<<grid, kRowsPerBlock * 32, 0, stream>>>(x, y, mean, rstd, w, b, rows, ni, eps);
    });
    TD_CUDA_LAUNCH_CHECK();
    return;
  }
  if (const int t = rows::block_threads(nv, norm_regs::kForwardMaxThreads); vec && t > 0) {
    norm_regs::forward_kernel<T, kLayer, rows::kBlockVecs, false>
        <<<rows::row_blocks(rows), t, 0, stream>>>(x, y, mean, rstd, w, b, rows, ni, eps);
    TD_CUDA_LAUNCH_CHECK();
    return;
  }
  // Fallback: unaligned or very long rows.
  const int threads = rows::threads_for_row(n, vec ? kVec16<T> : 1, kMaxThreads);
  const unsigned grid = rows::row_blocks(rows);
  const size_t cache = static_cast<size_t>(n) * sizeof(float);
  if (cache <= kCacheBytes) {
    norm_forward_kernel<T, kLayer, true>
        <<<grid, threads, cache, stream>>>(x, y, mean, rstd, w, b, rows, n, eps, vec);
  } else {
    norm_forward_kernel<T, kLayer, false>
        <<<grid, threads, 0, stream>>>(x, y, mean, rstd, w, b, rows, n, eps, vec);
  }
  TD_CUDA_LAUNCH_CHECK();
}

// The register-row backward (Note [Register rows]) when the rows allow it; false otherwise.
template <typename T, bool kLayer>
bool launch_backward_regs(const T* g, const T* x, const float* mean, const float* rstd,
                          const float* w, T* dx, float* pw, float* pb, int64_t rows, int64_t n,
                          const Chunking& ch, cudaStream_t stream) {
  if (!rows::rows_vectorizable<T>(n, {g, x, dx, w})) return false;
  const int64_t nv = n / kVec16<T>;
  const int ni = static_cast<int>(n);
  const auto grid = static_cast<unsigned>(ch.nchunks);
  if (const int k = rows::warp_vecs(nv); k > 0 && k <= norm_regs::kBackwardMaxWarpVecs<T>) {
    rows::with_warp_vecs<norm_regs::kBackwardMaxWarpVecs<T>>(k, [&](auto kv) {
      norm_regs::backward_kernel<T, kLayer, decltype(kv)::value, true>
          <<<grid, norm_regs::kBackwardWarps * 32, 0, stream>>>(g, x, mean, rstd, w, dx, pw, pb,
                                                                rows, ni, ch.chunk_rows);
    });
  } else if (const int t = rows::block_threads(nv, norm_regs::kBackwardMaxThreads,
                                               norm_regs::kBackwardBlockVecs<T>);
             t > 0) {
    norm_regs::backward_kernel<T, kLayer, norm_regs::kBackwardBlockVecs<T>, false>
        <<<grid, t, 0, stream>>>(g, x, mean, rstd, w, dx, pw, pb, rows, ni, ch.chunk_rows);
  } else {
    return false;
  }
  TD_CUDA_LAUNCH_CHECK();
  return true;
}

// Fallback backward (unaligned or very long rows): shared accumulators or column partials.
template <typename T, bool kLayer>
void launch_backward_fallback(const T* g, const T* x, const float* mean, const float* rstd,
                              const float* w, T* dx, float* pw, float* pb, int64_t rows, int64_t n,
                              const Chunking& ch, cudaStream_t stream) {
  const bool want = pw != nullptr || pb != nullptr;
  const bool vec = rows::rows_vectorizable<T>(n, {g, x, dx});
  const int threads = rows::threads_for_row(n, vec ? kVec16<T> : 1, kMaxThreads);
  const size_t acc = static_cast<size_t>((pw != nullptr) + (pb != nullptr)) *
                     static_cast<size_t>(n) * sizeof(float);
  if (want && acc <= max_dynamic_smem()) {
    auto* kernel = norm_backward_kernel<T, kLayer, true>;
    allow_smem(kernel, acc);
    kernel<<<static_cast<unsigned>(ch.nchunks), threads, acc, stream>>>(
        g, x, mean, rstd, w, dx, pw, pb, rows, n, ch.chunk_rows, ch.nchunks, vec);
    TD_CUDA_LAUNCH_CHECK();
  } else {
    norm_backward_kernel<T, kLayer, false><<<rows::row_blocks(rows), threads, 0, stream>>>(
        g, x, mean, rstd, w, dx, nullptr, nullptr, rows, n, 1, rows, vec);
    TD_CUDA_LAUNCH_CHECK();
    if (want) {
      const dim3 grid(static_cast<unsigned>(ceil_div(n, 32)), static_cast<unsigned>(ch.nchunks));
      norm_weight_partials_kernel<T, kLayer>
          <<<grid, dim3(32, 8), 0, stream>>>(g, x, mean, rstd, pw, pb, rows, n, ch.chunk_rows);
      TD_CUDA_LAUNCH_CHECK();
    }
  }
}

template <typename T, bool kLayer>
void launch_backward(const T* g, const T* x, const float* mean, const float* rstd, const float* w,
                     T* dx, float* dw, float* db, int64_t rows, int64_t n, void* scratch,
                     cudaStream_t stream) {
  const bool want = dw != nullptr || db != nullptr;
  const Chunking ch = chunking(rows, n);
  float* pw = dw != nullptr ? static_cast<float*>(scratch) : nullptr;
  float* pb =
      db != nullptr ? static_cast<float*>(scratch) + (dw != nullptr ? ch.nchunks * n : 0) : nullptr;
  if (!launch_backward_regs<T, kLayer>(g, x, mean, rstd, w, dx, pw, pb, rows, n, ch, stream)) {
    launch_backward_fallback<T, kLayer>(g, x, mean, rstd, w, dx, pw, pb, rows, n, ch, stream);
  }
  if (!want) return;
  // One launch for both gradients (grid y = 2) when both are wanted.
  const float* p0 = dw != nullptr ? pw : pb;
  float* o0 = dw != nullptr ? dw : db;
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kSumCols)),
                  dw != nullptr && db != nullptr ? 2 : 1);
  sum_chunks_kernel<<<grid, kSumThreads, 0, stream>>>(p0, pb, o0, db, ch.nchunks, n);
  TD_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename T>
void norm_forward(const T* x, T* y, float* mean, float* rstd, const float* w, const float* b,
                  int64_t rows, int64_t n, float eps, bool layer, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  if (layer) {
    launch_forward<T, true>(x, y, mean, rstd, w, b, rows, n, eps, stream);
  } else {
    launch_forward<T, false>(x, y, nullptr, rstd, w, nullptr, rows, n, eps, stream);
  }
}

size_t norm_backward_scratch_bytes(int64_t rows, int64_t n, bool want_dw, bool want_db) {
  if (rows <= 0 || n <= 0) return 0;
  const Chunking ch = chunking(rows, n);
  return static_cast<size_t>(want_dw + want_db) * static_cast<size_t>(ch.nchunks) *
         static_cast<size_t>(n) * sizeof(float);
}

template <typename T>
void norm_backward(const T* g, const T* x, const float* mean, const float* rstd, const float* w,
                   T* dx, float* dw, float* db, int64_t rows, int64_t n, void* scratch,
                   cudaStream_t stream) {
  if (n <= 0) return;
  if (rows <= 0) {  // empty sums
    if (dw != nullptr) TD_CUDA_CHECK(cudaMemsetAsync(dw, 0, n * sizeof(float), stream));
    if (db != nullptr) TD_CUDA_CHECK(cudaMemsetAsync(db, 0, n * sizeof(float), stream));
    return;
  }
  if (mean != nullptr) {
    launch_backward<T, true>(g, x, mean, rstd, w, dx, dw, db, rows, n, scratch, stream);
  } else {
    launch_backward<T, false>(g, x, nullptr, rstd, w, dx, dw, db, rows, n, scratch, stream);
  }
}

#define TD_INSTANTIATE_NORM(T)                                                                     \
  template void norm_forward<T>(const T*, T*, float*, float*, const float*, const float*, int64_t, \
                                int64_t, float, bool, cudaStream_t);                               \
  template void norm_backward<T>(const T*, const T*, const float*, const float*, const float*, T*, \
                                 float*, float*, int64_t, int64_t, void*, cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_INSTANTIATE_NORM)
#undef TD_INSTANTIATE_NORM

}  // namespace td::kernels
