#include "tardelli/ops/attention.h"

#include <bit>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/transpose.h"
#include "ops/cpu/vec_math.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/softmax.h"
#include "tardelli/ops/view.h"
#if TD_WITH_CUDA
#include "ops/cuda/attention.h"
#endif

// Note [Flash attention on the CPU]: the fused path follows FlashAttention-2. The forward walks
// query blocks of kBlockQ rows; for each it streams key/value blocks of kBlockK rows through an
// fp32 scratch, keeps a running row max m and row sum l (online softmax: when m grows, the sum
// and the output accumulator are rescaled by exp(m_old - m_new)) and never holds more than a
// kBlockQ x kBlockK tile of scores. It saves lse = m + log(l) per query row. The backward
// recomputes each probability tile as P = exp(scale * Q K^T - lse), then with
// D_i = rowsum(dO * O): dV += P^T dO, dP = dO V^T, dS = P * (dP - D), dQ += scale * dS K,
// dK += scale * dS^T Q. Work is split by (batch, kv-head) in the backward, so every dK/dV row
// (summed over the query heads that share it under GQA) is owned by one thread and summed in a
// fixed order: results do not depend on the thread count. Causal masking is bottom-right
// aligned (query i sees keys j <= i + Tk - Tq); key blocks entirely above the diagonal are
// skipped. bf16/f16 tiles are converted to fp32 on load; all arithmetic is fp32.

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;
// Below this many multiply-adds a parallel region costs more than it saves (tiny heads, tests).
constexpr int64_t kMinParallelWork = int64_t{1} << 18;
// Per-thread scratch (floats) up to which the backward holds a whole head's K, K^T and V^T
// (Note [Attention backward operands]): 128K floats = 512 KiB, T = 682 at D = 64.
constexpr int64_t kHoistFloats = int64_t{1} << 17;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Scores are finite: the exponentials use the clamped exp (Note [Clamped exp]).
using cpu::vexp_clamped;

// x[c] *= scale for c < n; returns the max.
float scale_max(float* __restrict x, int64_t n, float scale) {
  float mx = kNegInf;
#pragma omp simd reduction(max : mx)
  for (int64_t c = 0; c < n; ++c) {
    x[c] *= scale;
    mx = std::max(mx, x[c]);
  }
  return mx;
}

// Backward tile row: p = exp(s * scale - lse); dp <- p * (dp - D) * scale (that is, scale * dS).
void softmax_grad_row(float* __restrict p, float* __restrict dp, int64_t n, float scale, float lse,
                      float di) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) {
    const float e = vexp_clamped(p[c] * scale - lse);
    p[c] = e;
    dp[c] = e * (dp[c] - di) * scale;
  }
}

// Note [Attention micro-kernel]: the tiles are 64 x 64 x D, too small for oneDNN's threading
// and packing to pay off, but enough for a register-blocked kernel: a 6 x 16 tile of C lives in
// 12 ymm registers while K steps broadcast one A element per row and load one B row (the
// classic BLIS shape). Measured single-threaded on Zen 3 at 64^3 it matches dnnl_sgemm
// (~65 GFLOP/s CPU time). Without AVX2/FMA a plain loop is used.
#if defined(__AVX2__) && defined(__FMA__)
// A's element (i, k) is A[i * asi + k * ask]: row-major A has (lda, 1), a transposed one (1, lda).
template <int MR>
inline void gemm_tile16(int64_t K, const float* A, int64_t asi, int64_t ask, const float* B,
                        int64_t ldb, float* C, int64_t ldc) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    c0[i] = _mm256_loadu_ps(C + i * ldc);
    c1[i] = _mm256_loadu_ps(C + i * ldc + 8);
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(B + k * ldb), b1 = _mm256_loadu_ps(B + k * ldb + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(A + i * asi + k * ask);
      c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(C + i * ldc, c0[i]);
    _mm256_storeu_ps(C + i * ldc + 8, c1[i]);
  }
}
constexpr int64_t kTileN = 16;
#else
template <int MR>
inline void gemm_tile16(int64_t K, const float* A, int64_t asi, int64_t ask, const float* B,
                        int64_t ldb, float* C, int64_t ldc) {
  for (int i = 0; i < MR; ++i) {
    for (int64_t k = 0; k < K; ++k) {
      const float a = A[i * asi + k * ask];
      for (int j = 0; j < 16; ++j) C[i * ldc + j] = std::fma(a, B[k * ldb + j], C[i * ldc + j]);
    }
  }
}
constexpr int64_t kTileN = 16;
#endif

// Rows [i, i + mr) (mr < 6) of C over the 16-column chunk at j.
inline void gemm_rows_tail(int64_t mr, int64_t K, const float* A, int64_t asi, int64_t ask,
                           const float* B, int64_t ldb, float* C, int64_t ldc) {
  switch (mr) {
    case 5:
      return gemm_tile16<5>(K, A, asi, ask, B, ldb, C, ldc);
    case 4:
      return gemm_tile16<4>(K, A, asi, ask, B, ldb, C, ldc);
    case 3:
      return gemm_tile16<3>(K, A, asi, ask, B, ldb, C, ldc);
    case 2:
      return gemm_tile16<2>(K, A, asi, ask, B, ldb, C, ldc);
    case 1:
      return gemm_tile16<1>(K, A, asi, ask, B, ldb, C, ldc);
    default:
      return;
  }
}

// Note [Causal tiles]: on a block pair that straddles the causal diagonal, query row q of the
// score tile sees only its first vis[q] keys (vis non-decreasing in q), and P and dS are zero
// beyond them. The products skip what is masked, per micro-tile of up to 6 rows:
//   Mask::Scores     S = Q K^T, dP = dO V^T: only the 16-column chunks some row of the tile sees
//                    (the rest are never read);
//   Mask::QueryRows  P V, dS K (rows are queries, the contraction runs over keys): the tile's
//                    contraction stops at its last row's vis;
//   Mask::KeyRows    P^T dO, dS^T Q (rows are keys, the contraction runs over queries): it starts
//                    at the first query that sees the tile's first key.
// The skipped terms are exact zeros, so the results are unchanged; about half of each diagonal
// pair's products is skipped (4 of the 10 pairs of a T = 256 head in 64-row blocks).
enum class Mask { None, Scores, QueryRows, KeyRows };

// C[M, N] = (accumulate ? C : 0) + op(A)[M, K] B[K, N]; all row-major fp32 with leading dims;
// op(A) = A ([M, K], lda) or, with trans_a, A^T of the stored [K, M] (lda), read in place. With a
// mask, vis holds the visible keys per query row (Note [Causal tiles]).
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          float* C, int64_t ldc, bool accumulate, bool trans_a = false, Mask mask = Mask::None,
          const int64_t* vis = nullptr) {
  const int64_t asi = trans_a ? 1 : lda, ask = trans_a ? lda : 1;
  if (!accumulate) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
  }
  struct Bounds {
    int64_t kbeg, kend, nend;  // contraction [kbeg, kend), columns [0, nend)
  };
  auto bounds = [&](int64_t i, int64_t mr) {  // of rows [i, i + mr)
    Bounds t{0, K, N};
    if (mask == Mask::Scores) t.nend = vis[i + mr - 1];
    if (mask == Mask::QueryRows) t.kend = vis[i + mr - 1];
    if (mask == Mask::KeyRows) {
      while (t.kbeg < K && vis[t.kbeg] <= i) ++t.kbeg;
    }
    return t;
  };
  const int64_t n16 = N / kTileN * kTileN;
  for (int64_t i = 0; i < M; i += 6) {  // the bounds once per row tile
    const int64_t mr = std::min<int64_t>(6, M - i);
    const Bounds t = bounds(i, mr);
    if (t.kbeg >= t.kend) continue;
    const float* a = A + i * asi + t.kbeg * ask;
    for (int64_t j = 0; j < std::min(n16, t.nend); j += kTileN) {
      const float* b = B + t.kbeg * ldb + j;
      if (mr == 6) {
        gemm_tile16<6>(t.kend - t.kbeg, a, asi, ask, b, ldb, C + i * ldc + j, ldc);
      } else {
        gemm_rows_tail(mr, t.kend - t.kbeg, a, asi, ask, b, ldb, C + i * ldc + j, ldc);
      }
    }
  }
  if (n16 == N) return;
  for (int64_t i = 0; i < M; ++i) {
    const Bounds t = bounds(i, 1);
    float* c = C + i * ldc;
    for (int64_t k = t.kbeg; k < t.kend; ++k) {
      const float a = A[i * asi + k * ask];
      const float* b = B + k * ldb;
      for (int64_t j = n16; j < std::min(N, t.nend); ++j) c[j] = std::fma(a, b[j], c[j]);
    }
  }
}

// One [B, H, T, D] operand: base pointer and strides (elements) of any layout (T const for the
// inputs).
template <typename T>
struct Heads {
  T* data;
  int64_t sb, sh, st, sd;
  explicit Heads(const Tensor& t)
      : data(static_cast<T*>(t.data_ptr())),
        sb(t.stride(0)),
        sh(t.stride(1)),
        st(t.stride(2)),
        sd(t.stride(3)) {}
  T* head(int64_t b, int64_t h) const { return data + b * sb + h * sh; }
};

// Rows [t0, t0 + n) of one head into fp32 row-major dst [n, D] (ld = D).
template <typename T>
void load_rows(const T* head, int64_t st, int64_t sd, int64_t t0, int64_t n, int64_t D,
               float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const T* src = head + (t0 + r) * st;
    float* d = dst + r * D;
    if (sd == 1) {
      for (int64_t j = 0; j < D; ++j) d[j] = static_cast<float>(src[j]);
    } else {
      for (int64_t j = 0; j < D; ++j) d[j] = static_cast<float>(src[j * sd]);
    }
  }
}

// The same rows transposed: dst [D, n] (ld = ldt), through `rows` ([n, D] fp32 scratch) and the
// 8 x 8 register transpose (a direct strided store wrote one element per cache line).
template <typename T>
void load_rows_t(const T* head, int64_t st, int64_t sd, int64_t t0, int64_t n, int64_t D,
                 float* rows, float* dst, int64_t ldt) {
  load_rows(head, st, sd, t0, n, D, rows);
  cpu::transpose_plane(n, D, rows, D, dst, ldt);
}

// Rows of fp32 src [n, D] into rows of the output dtype, row r at dst + r * ld.
template <typename T>
void store_rows(const float* src, int64_t n, int64_t D, T* dst, int64_t ld) {
  for (int64_t r = 0; r < n; ++r) {
    const float* s = src + r * D;
    T* d = dst + r * ld;
    for (int64_t j = 0; j < D; ++j) d[j] = static_cast<T>(s[j]);
  }
}

struct Dims {
  int64_t B, H, Hkv, Tq, Tk, D, Dv, group, shift;  // shift = Tk - Tq (causal alignment)
  bool causal;
  float scale;
  // Keys visible to query row q: [0, limit(q)).
  int64_t limit(int64_t q) const { return causal ? std::min(Tk, q + shift + 1) : Tk; }
};

// Number of visible keys in [k0, k0 + nk) for each row of a query block, written to `vis`.
void visible(const Dims& d, int64_t q0, int64_t nq, int64_t k0, int64_t nk, int64_t* vis) {
  for (int64_t r = 0; r < nq; ++r) vis[r] = std::clamp<int64_t>(d.limit(q0 + r) - k0, 0, nk);
}

// Per-thread key/value operands of one (batch, kv-head): K^T [D, kn] and V [kn, Dv] (ld kn and
// Dv), for the whole head when it fits kHoistFloats (loaded once per head a thread works on),
// else for one key block at a time. `rows` is load_rows_t's scratch.
struct KeyValueTiles {
  int64_t kn;
  std::vector<float> kt, v, rows;
  int64_t head = -1;  // b * Hkv + hk held by the hoisted tiles
  KeyValueTiles(const Dims& d, bool hoist)
      : kn(hoist ? d.Tk : kBlockK), kt(d.D * kn), v(kn * d.Dv), rows(kn * std::max(d.D, d.Dv)) {}
};

// Note [Attention forward tasks]: tasks are (batch, head, query block), so short sequences
// still spread over the threads; parallel_for hands each thread a contiguous range, in which
// consecutive tasks share a head, and the thread loads that head's K^T and V once
// (KeyValueTiles) instead of once per (query block, key block) pair.
template <typename T>
void flash_forward_kernel(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse) {
  Heads<const T> Q(q), K(k), V(v);
  Heads<T> O(out);
  float* L = lse.data_ptr<float>();
  const int64_t nqb = (d.Tq + kBlockQ - 1) / kBlockQ;
  const int64_t D = d.D, Dv = d.Dv;
  const int64_t work = std::min(kBlockQ, d.Tq) * d.Tk * (D + Dv);  // per task, upper bound
  const int64_t grain = std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(work, 1));
  const bool hoist = d.Tk * (D + Dv) <= kHoistFloats;
  cpu::parallel_for(d.B * d.H * nqb, grain, [&](int64_t t0, int64_t t1) {
    KeyValueTiles kv(d, hoist);
    std::vector<float> qs(kBlockQ * D), s(kBlockQ * kBlockK), acc(kBlockQ * Dv), m(kBlockQ),
        l(kBlockQ);
    std::vector<int64_t> vis(kBlockQ);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / (d.H * nqb), h = (task / nqb) % d.H, qb = task % nqb;
      const int64_t hk = h / d.group;
      const int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, d.Tq - q0);
      const int64_t kend = d.limit(q0 + nq - 1);
      auto load_kv = [&](int64_t t0, int64_t n) {  // key rows [t0, t0 + n) into the tiles
        load_rows_t(K.head(b, hk), K.st, K.sd, t0, n, D, kv.rows.data(), kv.kt.data(), kv.kn);
        load_rows(V.head(b, hk), V.st, V.sd, t0, n, Dv, kv.v.data());
      };
      if (hoist && kv.head != b * d.Hkv + hk) {
        load_kv(0, d.Tk);
        kv.head = b * d.Hkv + hk;
      }
      load_rows(Q.head(b, h), Q.st, Q.sd, q0, nq, D, qs.data());
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k0 = 0; k0 < kend; k0 += kBlockK) {
        const int64_t nk = std::min(kBlockK, kend - k0);
        if (!hoist) load_kv(k0, nk);
        const int64_t off = hoist ? k0 : 0;  // this key block's first row in the tiles
        visible(d, q0, nq, k0, nk, vis.data());
        const bool part = vis[0] < nk;  // straddles the diagonal (Note [Causal tiles])
        gemm(nq, nk, D, qs.data(), D, kv.kt.data() + off, kv.kn, s.data(), kBlockK, false, false,
             part ? Mask::Scores : Mask::None, vis.data());
        for (int64_t r = 0; r < nq; ++r) {
          float* sr = s.data() + r * kBlockK;
          const int64_t n = vis[r];
          const float mnew = std::max(m[r], scale_max(sr, n, d.scale));
          const float sum =
              mnew == kNegInf ? 0.0f : cpu::exp_shift_sum<vexp_clamped>(sr, sr, n, mnew);
          for (int64_t c = n; c < nk; ++c) sr[c] = 0.0f;
          const float alpha = m[r] == kNegInf ? 0.0f : vexp_clamped(m[r] - mnew);
          if (alpha != 1.0f) {
            float* ar = acc.data() + r * Dv;
            for (int64_t j = 0; j < Dv; ++j) ar[j] *= alpha;
          }
          l[r] = l[r] * alpha + sum;
          m[r] = mnew;
        }
        gemm(nq, Dv, nk, s.data(), kBlockK, kv.v.data() + off * Dv, Dv, acc.data(), Dv, true, false,
             part ? Mask::QueryRows : Mask::None, vis.data());
      }
      for (int64_t r = 0; r < nq; ++r) {
        const float inv = 1.0f / l[r];
        float* ar = acc.data() + r * Dv;
        for (int64_t j = 0; j < Dv; ++j) ar[j] *= inv;
        L[(b * d.H + h) * d.Tq + q0 + r] = m[r] + std::log(l[r]);
      }
      store_rows(acc.data(), nq, Dv, O.head(b, h) + q0 * O.st, O.st);
    }
  });
}

template <typename T>
void flash_backward_kernel(const Dims& d, const Tensor& g, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& dq,
                           const Tensor& dk, const Tensor& dv) {
  Heads<const T> G(g), Q(q), K(k), V(v), O(o);
  Heads<T> DQ(dq), DK(dk), DV(dv);
  const float* L = lse.data_ptr<float>();
  const int64_t lsb = lse.stride(0), lsh = lse.stride(1), lst = lse.stride(2);
  const int64_t nqb = (d.Tq + kBlockQ - 1) / kBlockQ;
  const int64_t D = d.D, Dv = d.Dv;
  const int64_t work = d.group * d.Tq * d.Tk * (2 * D + 3 * Dv);  // per task, upper bound
  const int64_t grain = std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(work, 1));
  // Note [Attention backward operands]: every query block of a (batch, kv-head) task reads
  // the same keys and values, so when the head's K, K^T and V^T fit kHoistFloats they are
  // loaded (and transposed) once per task rather than once per (query, key) block pair; longer
  // heads load each key block where it is used. P^T dO and dS^T Q read P and dS transposed in
  // place (the micro-kernel takes A's strides), so no tile is transposed.
  const bool hoist = d.Tk * (2 * D + Dv) <= kHoistFloats;
  cpu::parallel_for(d.B * d.Hkv, grain, [&](int64_t t0, int64_t t1) {
    const int64_t kn = hoist ? d.Tk : kBlockK;  // rows held of K, K^T and V^T
    std::vector<float> qs(kBlockQ * D), gs(kBlockQ * Dv), os(kBlockQ * Dv), ks(kn * D), kt(D * kn),
        vt(Dv * kn), rows(kn * Dv), p(kBlockQ * kBlockK), dp(kBlockQ * kBlockK), dqa(kBlockQ * D),
        di(kBlockQ), ls(kBlockQ), dka(d.Tk * D), dva(d.Tk * Dv);
    std::vector<int64_t> vis(kBlockQ);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / d.Hkv, hk = task % d.Hkv;
      std::fill(dka.begin(), dka.end(), 0.0f);
      std::fill(dva.begin(), dva.end(), 0.0f);
      auto load_kv = [&](int64_t t0, int64_t n) {  // K, K^T and V^T of key rows [t0, t0 + n)
        load_rows(K.head(b, hk), K.st, K.sd, t0, n, D, ks.data());
        cpu::transpose_plane(n, D, ks.data(), D, kt.data(), kn);
        load_rows_t(V.head(b, hk), V.st, V.sd, t0, n, Dv, rows.data(), vt.data(), kn);
      };
      if (hoist) load_kv(0, d.Tk);
      for (int64_t h = hk * d.group; h < (hk + 1) * d.group; ++h) {
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, d.Tq - q0);
          load_rows(Q.head(b, h), Q.st, Q.sd, q0, nq, D, qs.data());
          load_rows(G.head(b, h), G.st, G.sd, q0, nq, Dv, gs.data());
          load_rows(O.head(b, h), O.st, O.sd, q0, nq, Dv, os.data());
          for (int64_t r = 0; r < nq; ++r) {
            const float* gr = gs.data() + r * Dv;
            const float* orr = os.data() + r * Dv;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t j = 0; j < Dv; ++j) acc += gr[j] * orr[j];
            di[r] = acc;
            ls[r] = L[b * lsb + h * lsh + (q0 + r) * lst];
          }
          std::fill(dqa.begin(), dqa.end(), 0.0f);
          const int64_t kend = d.limit(q0 + nq - 1);
          for (int64_t k0 = 0; k0 < kend; k0 += kBlockK) {
            const int64_t nk = std::min(kBlockK, kend - k0);
            if (!hoist) load_kv(k0, nk);
            const int64_t off = hoist ? k0 : 0;  // this key block's first row in ks/kt/vt
            const float* kb = ks.data() + off * D;
            visible(d, q0, nq, k0, nk, vis.data());
            const bool part = vis[0] < nk;  // straddles the diagonal (Note [Causal tiles])
            const Mask scores = part ? Mask::Scores : Mask::None;
            gemm(nq, nk, D, qs.data(), D, kt.data() + off, kn, p.data(), kBlockK, false, false,
                 scores, vis.data());
            gemm(nq, nk, Dv, gs.data(), Dv, vt.data() + off, kn, dp.data(), kBlockK, false, false,
                 scores, vis.data());
            for (int64_t r = 0; r < nq; ++r) {
              float* pr = p.data() + r * kBlockK;
              float* dpr = dp.data() + r * kBlockK;
              const int64_t n = vis[r];
              softmax_grad_row(pr, dpr, n, d.scale, ls[r], di[r]);
              for (int64_t c = n; c < nk; ++c) pr[c] = dpr[c] = 0.0f;
            }
            const Mask keys = part ? Mask::KeyRows : Mask::None;
            gemm(nk, Dv, nq, p.data(), kBlockK, gs.data(), Dv, dva.data() + k0 * Dv, Dv, true,
                 /*trans_a=*/true, keys, vis.data());
            gemm(nk, D, nq, dp.data(), kBlockK, qs.data(), D, dka.data() + k0 * D, D, true,
                 /*trans_a=*/true, keys, vis.data());
            gemm(nq, D, nk, dp.data(), kBlockK, kb, D, dqa.data(), D, true, false,
                 part ? Mask::QueryRows : Mask::None, vis.data());
          }
          store_rows(dqa.data(), nq, D, DQ.head(b, h) + q0 * DQ.st, DQ.st);
        }
      }
      store_rows(dka.data(), d.Tk, D, DK.head(b, hk), DK.st);
      store_rows(dva.data(), d.Tk, Dv, DV.head(b, hk), DV.st);
    }
  });
}

// An empty [B, H, T, D] tensor (shape s) stored as [B, T, H, D]: the layout of the attention's
// output and of its input gradients (Note [Attention output layout]).
Tensor heads_layout(const Shape& s, DType dt, Device dev) {
  return Tensor::empty({s[0], s[2], s[1], s[3]}, dt, dev).permute({0, 2, 1, 3});
}

Dims check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
               std::optional<double> scale, const char* op) {
  ops::check_defined(q, op, "query");
  ops::check_defined(k, op, "key");
  ops::check_defined(v, op, "value");
  for (const Tensor* t : {&q, &k, &v}) {
    ops::check_same_device(q, *t, op);
    ops::check_floating(*t, op);
  }
  TD_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
           ": query, key and value must share a dtype, got ", describe(q), ", ", describe(k), ", ",
           describe(v));
  TD_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
           ": expected 4-D [B, H, T, D] query, key and value, got ", shape_str(q.sizes()), ", ",
           shape_str(k.sizes()), ", ", shape_str(v.sizes()));
  Dims d;
  d.B = q.size(0);
  d.H = q.size(1);
  d.Tq = q.size(2);
  d.D = q.size(3);
  d.Hkv = k.size(1);
  d.Tk = k.size(2);
  d.Dv = v.size(3);
  TD_CHECK(k.size(0) == d.B && v.size(0) == d.B && k.size(3) == d.D && v.size(1) == d.Hkv &&
               v.size(2) == d.Tk,
           op, ": incompatible shapes query ", shape_str(q.sizes()), ", key ", shape_str(k.sizes()),
           ", value ", shape_str(v.sizes()),
           " (expected key [B, Hkv, Tk, D] and value [B, Hkv, Tk, Dv])");
  TD_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0, op, ": query heads (", d.H,
           ") must be a multiple of key/value heads (", d.Hkv, ")");
  TD_CHECK(!is_causal || d.Tq <= d.Tk, op, ": causal attention needs Tq <= Tk (the last query ",
           "is aligned with the last key), got Tq = ", d.Tq, ", Tk = ", d.Tk);
  d.group = d.H / std::max<int64_t>(d.Hkv, 1);
  d.shift = d.Tk - d.Tq;
  d.causal = is_causal;
  d.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d.D)));
  return d;
}

// Float mask added to the scores: a bool mask (True = attend) becomes 0 / -inf.
Tensor additive_mask(const Tensor& mask, DType dt, const Shape& scores, const char* op) {
  TD_CHECK(broadcast_shapes(mask.sizes(), scores, op) == scores, op, ": attn_mask ",
           shape_str(mask.sizes()), " does not broadcast to the scores ", shape_str(scores));
  if (mask.dtype() != DType::Bool) {
    TD_CHECK(mask.dtype() == dt, op, ": attn_mask must be bool or match the query dtype ",
             dtype_name(dt), ", got ", describe(mask));
    return mask;
  }
  if (!mask.is_cpu()) {
    return where(mask, scalar_tensor(0.0, dt, mask.device()),
                 scalar_tensor(-std::numeric_limits<double>::infinity(), dt, mask.device()));
  }
  Tensor out = Tensor::empty(mask.sizes(), dt, mask.device());
  TD_DISPATCH_FLOATING(dt, op, [&]<typename T>() {
    cpu::map<T, bool>(
        out,
        [](bool keep) { return keep ? acc_t<T>(0) : -std::numeric_limits<acc_t<T>>::infinity(); },
        {mask});
  });
  return out;
}

// softmax(q k^T * scale + mask) v from differentiable ops (the scores are materialized).
// Grouped heads are a broadcast batch dim: q viewed as [B, Hkv, g, Tq, D] against k/v
// unsqueezed to [B, Hkv, 1, Tk, D], so no key/value copies.
Tensor composite_attention(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& mask) {
  Tensor qg = reshape(q, {d.B, d.Hkv, d.group, d.Tq, d.D});
  Tensor s = mul(matmul(qg, transpose(unsqueeze(k, 2), -2, -1)), static_cast<double>(d.scale));
  s = reshape(s, {d.B, d.H, d.Tq, d.Tk});
  if (mask.defined()) {
    s = add(s, additive_mask(mask, q.dtype(), s.sizes(), "scaled_dot_product_attention"));
  }
  Tensor p = softmax(s, -1);
  Tensor o = matmul(reshape(p, {d.B, d.Hkv, d.group, d.Tq, d.Tk}), unsqueeze(v, 2));
  return reshape(o, {d.B, d.H, d.Tq, d.Dv});
}

}  // namespace

AttentionForward flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         bool is_causal, double scale) {
  const char* op = "flash_attention_forward";
  Dims d = check_qkv(q, k, v, is_causal, scale, op);
#if TD_WITH_CUDA
  if (q.is_cuda()) return cuda_ops::flash_attention_forward(q, k, v, is_causal, d.scale);
#endif
  for (const Tensor* t : {&q, &k, &v}) ops::check_cpu(*t, op);
  AttentionForward r;
  // Note [Attention output layout]: the output is a [B, H, Tq, Dv] view of a [B, Tq, H, Dv]
  // buffer, the layout the attention's output projection reads as [B, Tq, H * Dv]: a model's
  // transpose(1, 2).reshape(...) after attention is then a view, not a copy (and not a second
  // saved activation).
  r.out = heads_layout({d.B, d.H, d.Tq, d.Dv}, q.dtype(), q.device());
  r.lse = Tensor::empty({d.B, d.H, d.Tq}, DType::Float32, q.device());
  if (r.out.numel() == 0) return r;
  if (d.Tk == 0) {
    // No keys: torch gives NaN rows (softmax over nothing).
    r.out.fill_(NAN);
    r.lse.fill_(-INFINITY);
    return r;
  }
  TD_DISPATCH_FLOATING(q.dtype(), "flash_attention_forward",
                       [&]<typename T>() { flash_forward_kernel<T>(d, q, k, v, r.out, r.lse); });
  return r;
}

std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const Tensor& out, const Tensor& lse,
                                                            bool is_causal, double scale) {
  const char* op = "flash_attention_backward";
  Dims d = check_qkv(q, k, v, is_causal, scale, op);
  Shape oshape{d.B, d.H, d.Tq, d.Dv};
  ops::check_defined(grad_out, op, "grad_out");
  ops::check_defined(out, op, "out");
  ops::check_defined(lse, op, "lse");
  TD_CHECK(grad_out.sizes() == oshape && out.sizes() == oshape, op, ": grad_out ",
           describe(grad_out), " and out ", describe(out), " must be ", shape_str(oshape));
  TD_CHECK(grad_out.dtype() == q.dtype() && out.dtype() == q.dtype(), op,
           ": grad_out and out must have the query dtype, got ", describe(grad_out), " and ",
           describe(out));
  TD_CHECK(lse.dtype() == DType::Float32 && lse.sizes() == Shape({d.B, d.H, d.Tq}), op,
           ": lse must be float32 ", shape_str({d.B, d.H, d.Tq}), ", got ", describe(lse));
#if TD_WITH_CUDA
  if (q.is_cuda()) {
    return cuda_ops::flash_attention_backward(grad_out, q, k, v, out, lse, is_causal, d.scale);
  }
#endif
  for (const Tensor* t : {&q, &k, &v, &grad_out, &out, &lse}) ops::check_cpu(*t, op);
  // The gradients have the forward output's layout: q, k and v are usually head views of one
  // [B, T, 3 * H * D] projection, and the gradient copies back into it are then runs of whole
  // rows.
  Tensor dq = heads_layout(q.sizes(), q.dtype(), q.device());
  Tensor dk = heads_layout(k.sizes(), k.dtype(), k.device());
  Tensor dv = heads_layout(v.sizes(), v.dtype(), v.device());
  if (d.Tq == 0 || d.Tk == 0 || d.B == 0 || d.H == 0) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  TD_DISPATCH_FLOATING(q.dtype(), op, [&]<typename T>() {
    flash_backward_kernel<T>(d, grad_out, q, k, v, out, lse, dq, dk, dv);
  });
  return {dq, dk, dv};
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, bool is_causal,
                                    std::optional<double> scale) {
  const char* op = "scaled_dot_product_attention";
  Dims d = check_qkv(q, k, v, is_causal, scale, op);
  if (attn_mask.defined()) {
    TD_CHECK(!is_causal, op, ": pass either attn_mask or is_causal, not both (as torch)");
    return composite_attention(d, q, k, v, attn_mask);
  }
  AttentionForward f =
      flash_attention_forward(q.detach(), k.detach(), v.detach(), is_causal, d.scale);
  Tensor out = f.out;
  if (needs_grad({q, k, v})) {
    record("ScaledDotProductAttentionBackward", {q, k, v}, {&out},
           [q, k, v, o = out.detach(), lse = f.lse, is_causal, s = d.scale](const TensorList& g,
                                                                            const auto&) {
             auto [dq, dk, dv] = flash_attention_backward(g[0], q.detach(), k.detach(), v.detach(),
                                                          o, lse, is_causal, s);
             return TensorList{dq, dk, dv};
           });
  }
  return out;
}

}  // namespace td
