#include "ops/cpu/transpose.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ops/cpu/loops.h"

namespace td::cpu {

namespace {

constexpr int64_t kTile = 8;  // the register tile, in elements per side
// A work unit: br destination rows (a contiguous run of each source row) by bc destination
// columns (source rows), in one of two shapes chosen by the source's row stride.
// Note [Transpose blocks]: long source rows (>= kLongRowBytes apart) get tall, narrow units
// walked source row group by source row group, which keep the reads streaming (they beat square
// 64 x 64 units by 1.3-1.8x there); shorter rows get 128 x 64 units walked destination row group
// by destination row group, so that each destination line is finished before the next. Measured
// on the Zen 3 VM (2 threads, huge pages, interleaved repetitions, median ms):
//   source          256 x 32, source rows outer   128 x 64, destination rows outer
//   [2048, 1024]    1.72                          1.24
//   [2048, 256]     0.215                         0.100
//   [512, 8192]     3.46                          4.51
struct BlockShape {
  int64_t br, bc;
  bool dst_rows_outer;
};
constexpr int64_t kLongRowBytes = 16384;
constexpr BlockShape kLongRows{256, 32, false};
constexpr BlockShape kShortRows{128, 64, true};
constexpr int64_t kMinElems = 4096;  // below this the generic copy is as fast

// One 2-D problem: D[r * ldd + c] = S[r + c * lds] for r < R, c < C (element units).
struct Plane {
  int64_t R, C, lds, ldd;
};

template <typename T>
void tile_scalar(const T* s, int64_t lds, T* d, int64_t ldd, int64_t rn, int64_t cn) {
  for (int64_t r = 0; r < rn; ++r) {
    for (int64_t c = 0; c < cn; ++c) d[r * ldd + c] = s[r + c * lds];
  }
}

// 8 x 8 transpose of 4-byte elements in AVX2 registers: rows c of the source (8 consecutive r
// each) become rows r of the destination (8 consecutive c each). Integer shuffles only, so the
// bits (NaN payloads included) move unchanged.
inline void tile8x8_b32(const uint32_t* s, int64_t lds, uint32_t* d, int64_t ldd) {
  __m256i v[8], t[8];
  for (int i = 0; i < 8; ++i)
    v[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * lds));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    v[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    v[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    v[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    v[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // v[0..3] hold columns 0..3 of rows 0-3 (low lane) and 4-7 (high lane) of source rows 0-3;
  // v[4..7] the same for source rows 4-7. Join the lanes.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2x128_si256(v[i], v[i + 4], 0x20);
    t[i + 4] = _mm256_permute2x128_si256(v[i], v[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i * ldd), t[i]);
}

template <typename T>
inline void tile(const T* s, T* d, const Plane& p, int64_t r, int64_t c) {
  const T* st = s + r + c * p.lds;
  T* dt = d + r * p.ldd + c;
  if constexpr (sizeof(T) == 4) {
    tile8x8_b32(st, p.lds, dt, p.ldd);
  } else {
    tile_scalar(st, p.lds, dt, p.ldd, kTile, kTile);
  }
}

template <typename T>
void block(const T* s, T* d, const Plane& p, const BlockShape& b, int64_t r0, int64_t c0) {
  const int64_t r1 = std::min(p.R, r0 + b.br), c1 = std::min(p.C, c0 + b.bc);
  const int64_t rf = r0 + (r1 - r0) / kTile * kTile, cf = c0 + (c1 - c0) / kTile * kTile;
  if (b.dst_rows_outer) {
    for (int64_t r = r0; r < rf; r += kTile) {
      for (int64_t c = c0; c < cf; c += kTile) tile(s, d, p, r, c);
    }
  } else {
    for (int64_t c = c0; c < cf; c += kTile) {
      for (int64_t r = r0; r < rf; r += kTile) tile(s, d, p, r, c);
    }
  }
  if (rf < r1)
    tile_scalar(s + rf + c0 * p.lds, p.lds, d + rf * p.ldd + c0, p.ldd, r1 - rf, cf - c0);
  if (cf < c1)
    tile_scalar(s + r0 + cf * p.lds, p.lds, d + r0 * p.ldd + cf, p.ldd, r1 - r0, c1 - cf);
}

template <typename T>
void run(const Tensor& dst, const Tensor& src, int p) {
  const int nd = static_cast<int>(dst.dim()), q = nd - 1;
  const Plane pl{dst.size(p), dst.size(q), src.stride(q), dst.stride(p)};
  // The remaining dims are a batch of planes.
  int bdims[kMaxDims];
  int nb = 0;
  int64_t batch = 1;
  for (int i = 0; i < nd; ++i) {
    if (i == p || i == q) continue;
    bdims[nb++] = i;
    batch *= dst.size(i);
  }
  const BlockShape bs =
      pl.lds * static_cast<int64_t>(sizeof(T)) >= kLongRowBytes ? kLongRows : kShortRows;
  const int64_t rb = (pl.R + bs.br - 1) / bs.br, cb = (pl.C + bs.bc - 1) / bs.bc;
  const T* s0 = static_cast<const T*>(src.data_ptr());
  T* d0 = static_cast<T*>(dst.data_ptr());
  const int64_t units = batch * rb * cb;
  parallel_for(units, std::max<int64_t>(1, kGrain / (bs.br * bs.bc)), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t rest = u / (rb * cb);
      const int64_t within = u % (rb * cb);
      int64_t so = 0, dof = 0;
      for (int k = nb - 1; k >= 0; --k) {
        const int i = bdims[k];
        const int64_t idx = rest % dst.size(i);
        rest /= dst.size(i);
        so += idx * src.stride(i);
        dof += idx * dst.stride(i);
      }
      block(s0 + so, d0 + dof, pl, bs, (within / cb) * bs.br, (within % cb) * bs.bc);
    }
  });
}

}  // namespace

bool transpose_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.sizes() != src.sizes() || dst.dim() < 2 ||
      dst.dim() > kMaxDims || dst.numel() < kMinElems)
    return false;
  const int nd = static_cast<int>(dst.dim()), q = nd - 1;
  if (dst.stride(q) != 1 || src.stride(q) == 1 || dst.size(q) < kTile) return false;
  int p = -1;
  for (int i = 0; i < q; ++i) {
    if (src.size(i) > 1 && src.stride(i) == 1) p = i;
    if (src.size(i) > 1 && src.stride(i) == 0) return false;  // broadcast: not a transposition
  }
  if (p < 0 || dst.size(p) < kTile) return false;
  switch (dst.element_size()) {
    case 1:
      run<uint8_t>(dst, src, p);
      return true;
    case 2:
      run<uint16_t>(dst, src, p);
      return true;
    case 4:
      run<uint32_t>(dst, src, p);
      return true;
    case 8:
      run<uint64_t>(dst, src, p);
      return true;
    default:
      return false;
  }
}

void transpose_plane(int64_t R, int64_t C, const float* src, int64_t lds, float* dst, int64_t ldd) {
  // One block covering the plane, in block()'s destination view (C destination rows, the
  // source's columns, by R destination columns), walked source row group by source row group.
  block(reinterpret_cast<const uint32_t*>(src), reinterpret_cast<uint32_t*>(dst),
        Plane{C, R, lds, ldd}, BlockShape{C, R, false}, 0, 0);
}

}  // namespace td::cpu
