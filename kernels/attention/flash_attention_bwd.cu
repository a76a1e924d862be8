// Tensor-core attention backward (FlashAttention-2 math, deterministic): with
// P = exp2(scale log2(e) Q K^T - log2(e) lse) recomputed tile by tile and delta = rowsum(dO * O),
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),  dK = scale dS^T Q,  dQ = scale dS K.
// Two kernels, neither with atomics:
// - dK/dV: one CTA per (key tile of 16 * kWarps rows, batch * kv head); each warp owns 16 keys
//   and keeps their dK, dV in fp32 registers while the CTA walks the query heads of the GQA group
//   and, for each, the query tiles that see the key tile (Q, dO, lse, delta double-buffered
//   through shared memory). It computes the transposed products S^T = K Q^T and dP^T = V dO^T so
//   that P^T and dS^T are A fragments of dV += P^T dO and dK += dS^T Q straight from registers.
// - dQ: one CTA per (query tile, batch * head), the forward's loop over key tiles, recomputing
//   S and dP; dQ += dS K from registers.
#include "attention/flash_attention.cuh"
#include "attention/flash_attention_mma.cuh"
#include "common/cuda_types.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {

namespace {

using namespace attn;

struct BwdArgs {
  const void* dout;
  const void* q;
  const void* k;
  const void* v;
  const float* lse;
  const float* delta;
  void* dq;
  void* dk;
  void* dv;
  int H, Hkv, group, Tq, Tk, shift;
  bool causal;
  float scale;       // for dQ, dK
  float scale_log2;  // scale * log2(e), for P
};

// ---------------------------------------------------------------------------------------------
// dK, dV.

template <int D, int kWarps, int BM>
struct DkvCfg {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 16 * kWarps;  // keys per CTA
  static constexpr int kBlockM = BM;           // queries per step
  static constexpr int kLd = D + kPad;
  // K, V; two buffers each of Q and dO; two buffers each of lse and delta.
  template <typename T>
  static constexpr size_t smem_bytes() {
    return static_cast<size_t>(2 * kBlockN + 4 * kBlockM) * kLd * sizeof(T) +
           4 * kBlockM * sizeof(float);
  }
};

template <typename T, int D, int kWarps, int BM>
__global__ void __launch_bounds__(kWarps * 32) flash_bwd_dkdv_kernel(const BwdArgs a) {
  using Cfg = DkvCfg<D, kWarps, BM>;
  constexpr int BN = Cfg::kBlockN, LD = Cfg::kLd, NT = Cfg::kThreads;
  constexpr int kDT = D / 8;   // 8-wide head-dim tiles
  constexpr int kMT = BM / 8;  // 8-wide query tiles of S^T
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);
  T* Vs = Ks + BN * LD;
  T* Qs = Vs + BN * LD;                                    // two buffers of BM * LD
  T* Gs = Qs + 2 * BM * LD;                                // dO, two buffers of BM * LD
  float* Ls = reinterpret_cast<float*>(Gs + 2 * BM * LD);  // lse * log2(e), two buffers of BM
  float* Es = Ls + 2 * BM;                                 // delta, two buffers of BM

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int bkv = blockIdx.x;  // b * Hkv + hkv
  const int b = bkv / a.Hkv, hkv = bkv % a.Hkv;
  const int n0 = blockIdx.y * BN;  // the keys seen by the most queries go first
  const T* k = static_cast<const T*>(a.k) + (static_cast<int64_t>(bkv) * a.Tk + n0) * D;
  const T* v = static_cast<const T*>(a.v) + (static_cast<int64_t>(bkv) * a.Tk + n0) * D;

  // Query tiles [mb0, num_mb) see some key of this tile: query i sees key j iff j <= i + shift.
  const int mb0 = a.causal ? max(0, n0 - a.shift) / BM : 0;
  const int num_mb = (a.Tq + BM - 1) / BM;
  const int per_head = num_mb - mb0;  // >= 1: n0 < Tk, so n0 - shift < Tq
  const int steps = a.group * per_head;

  // Stage step `it` (query head, query tile) into buffer `buf`.
  auto stage = [&](int it, int buf) {
    const int h = b * a.H + hkv * a.group + it / per_head;  // b * H + query head
    const int m0 = (mb0 + it % per_head) * BM;
    const int64_t row0 = static_cast<int64_t>(h) * a.Tq + m0;
    const int valid = min(BM, a.Tq - m0);
    load_tile<T, BM, D, NT>(Qs + buf * BM * LD, static_cast<const T*>(a.q) + row0 * D, valid, tid);
    load_tile<T, BM, D, NT>(Gs + buf * BM * LD, static_cast<const T*>(a.dout) + row0 * D, valid,
                            tid);
    for (int r = tid; r < BM; r += NT) {
      // Padded query rows get P = exp2(-inf) = 0 and delta 0, so they add nothing.
      Ls[buf * BM + r] = r < valid ? a.lse[row0 + r] * kLog2e : INFINITY;
      Es[buf * BM + r] = r < valid ? a.delta[row0 + r] : 0.f;
    }
  };

  const int key_valid = min(BN, a.Tk - n0);
  load_tile<T, BN, D, NT>(Ks, k, key_valid, tid);
  load_tile<T, BN, D, NT>(Vs, v, key_valid, tid);
  stage(0, 0);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  float dk[kDT][4], dv[kDT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j) {
    dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = 0.f;
    dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.f;
  }
  const int key0 = n0 + warp * 16 + g;  // keys key0 and key0 + 8

  for (int it = 0; it < steps; ++it) {
    const int buf = it & 1;
    if (it + 1 < steps) {
      stage(it + 1, buf ^ 1);
      cp_async_commit();
    }
    const T* Qb = Qs + buf * BM * LD;
    const T* Gb = Gs + buf * BM * LD;
    const float* Lb = Ls + buf * BM;
    const float* Eb = Es + buf * BM;
    const int m0 = (mb0 + it % per_head) * BM;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x BM queries.
    float st[kMT][4], dpt[kMT][4];
#pragma unroll
    for (int j = 0; j < kMT; ++j) {
      st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.f;
      dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.f;
    }
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      uint32_t ka[4], va[4];
      load_a(ka, Ks, LD, warp * 16, kd * 16, lane);
      load_a(va, Vs, LD, warp * 16, kd * 16, lane);
#pragma unroll
      for (int mp = 0; mp < BM / 16; ++mp) {
        uint32_t bq[4], bg[4];
        load_b_nk(bq, Qb, LD, mp * 16, kd * 16, lane);
        load_b_nk(bg, Gb, LD, mp * 16, kd * 16, lane);
        mma16816<T>(st[2 * mp], ka, bq[0], bq[1]);
        mma16816<T>(st[2 * mp + 1], ka, bq[2], bq[3]);
        mma16816<T>(dpt[2 * mp], va, bg[0], bg[1]);
        mma16816<T>(dpt[2 * mp + 1], va, bg[2], bg[3]);
      }
    }

    // P^T into st, dS^T (without the scale) into dpt. Element e of tile j: key key0 + 8 (e >> 1),
    // query m0 + 8 j + 2 t4 + (e & 1).
    const bool need_mask = n0 + BN > a.Tk || (a.causal && n0 + BN - 1 > m0 + a.shift);
#pragma unroll
    for (int j = 0; j < kMT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = j * 8 + 2 * t4 + (e & 1);  // query within the tile
        float p = exp2f(st[j][e] * a.scale_log2 - Lb[qc]);
        if (need_mask) {
          const int key = key0 + (e >> 1) * 8, query = m0 + qc;
          if (key >= a.Tk || (a.causal && key > query + a.shift)) p = 0.f;
        }
        st[j][e] = p;
        dpt[j][e] = p * (dpt[j][e] - Eb[qc]);
      }
    }

    // dV += P^T dO, dK += dS^T Q: k runs over the tile's queries.
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(st[2 * kk][0], st[2 * kk][1]),
                              pack2<T>(st[2 * kk][2], st[2 * kk][3]),
                              pack2<T>(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                              pack2<T>(st[2 * kk + 1][2], st[2 * kk + 1][3])};
      const uint32_t sa[4] = {pack2<T>(dpt[2 * kk][0], dpt[2 * kk][1]),
                              pack2<T>(dpt[2 * kk][2], dpt[2 * kk][3]),
                              pack2<T>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                              pack2<T>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bg[4], bq[4];
        load_b_kn(bg, Gb, LD, kk * 16, dp * 16, lane);
        load_b_kn(bq, Qb, LD, kk * 16, dp * 16, lane);
        mma16816<T>(dv[2 * dp], pa, bg[0], bg[1]);
        mma16816<T>(dv[2 * dp + 1], pa, bg[2], bg[3]);
        mma16816<T>(dk[2 * dp], sa, bq[0], bq[1]);
        mma16816<T>(dk[2 * dp + 1], sa, bq[2], bq[3]);
      }
    }
    cp_async_wait_all();
    __syncthreads();  // the next step is staged; nobody reads this buffer any more
  }

  T* dkp = static_cast<T*>(a.dk) + static_cast<int64_t>(bkv) * a.Tk * D;
  T* dvp = static_cast<T*>(a.dv) + static_cast<int64_t>(bkv) * a.Tk * D;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = key0 + 8 * i;
    if (key < a.Tk) {
      const int64_t off = static_cast<int64_t>(key) * D + 2 * t4;
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        store2<T>(dkp + off + j * 8, dk[j][2 * i] * a.scale, dk[j][2 * i + 1] * a.scale);
        store2<T>(dvp + off + j * 8, dv[j][2 * i], dv[j][2 * i + 1]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// dQ.

template <int D, int kWarps>
struct DqCfg {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kBlockN = 64;
  static constexpr int kLd = D + kPad;
  // Q, dO; two buffers each of K and V.
  template <typename T>
  static constexpr size_t smem_bytes() {
    return static_cast<size_t>(2 * kBlockM + 4 * kBlockN) * kLd * sizeof(T);
  }
};

template <typename T, int D, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) flash_bwd_dq_kernel(const BwdArgs a) {
  using Cfg = DqCfg<D, kWarps>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, LD = Cfg::kLd, NT = Cfg::kThreads;
  constexpr int kDT = D / 8;
  constexpr int kNT = BN / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* Gs = Qs + BM * LD;
  T* Ks = Gs + BM * LD;      // two buffers of BN * LD
  T* Vs = Ks + 2 * BN * LD;  // two buffers of BN * LD

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x;
  const int hkv = (bh / a.H) * a.Hkv + (bh % a.H) / a.group;
  const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int64_t qrow0 = static_cast<int64_t>(bh) * a.Tq + m0;
  const T* k = static_cast<const T*>(a.k) + static_cast<int64_t>(hkv) * a.Tk * D;
  const T* v = static_cast<const T*>(a.v) + static_cast<int64_t>(hkv) * a.Tk * D;

  const int n_end = a.causal ? min(a.Tk, m0 + BM + a.shift) : a.Tk;
  const int n_blocks = (n_end + BN - 1) / BN;

  const int valid = min(BM, a.Tq - m0);
  load_tile<T, BM, D, NT>(Qs, static_cast<const T*>(a.q) + qrow0 * D, valid, tid);
  load_tile<T, BM, D, NT>(Gs, static_cast<const T*>(a.dout) + qrow0 * D, valid, tid);
  load_tile<T, BN, D, NT>(Ks, k, min(BN, a.Tk), tid);
  load_tile<T, BN, D, NT>(Vs, v, min(BN, a.Tk), tid);
  cp_async_commit();

  const int rl = warp * 16 + g;  // rows rl and rl + 8 of the tile
  float lse2[2], dlt[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool ok = rl + 8 * i < valid;
    lse2[i] = ok ? a.lse[qrow0 + rl + 8 * i] * kLog2e : INFINITY;
    dlt[i] = ok ? a.delta[qrow0 + rl + 8 * i] : 0.f;
  }
  cp_async_wait_all();
  __syncthreads();

  float dq[kDT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int buf = nb & 1;
    if (nb + 1 < n_blocks) {
      const int n1 = (nb + 1) * BN;
      load_tile<T, BN, D, NT>(Ks + (buf ^ 1) * BN * LD, k + static_cast<int64_t>(n1) * D,
                              min(BN, a.Tk - n1), tid);
      load_tile<T, BN, D, NT>(Vs + (buf ^ 1) * BN * LD, v + static_cast<int64_t>(n1) * D,
                              min(BN, a.Tk - n1), tid);
      cp_async_commit();
    }
    const T* Kb = Ks + buf * BN * LD;
    const T* Vb = Vs + buf * BN * LD;

    float s[kNT][4], dp[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
    }
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      uint32_t qa[4], ga[4];
      load_a(qa, Qs, LD, warp * 16, kd * 16, lane);
      load_a(ga, Gs, LD, warp * 16, kd * 16, lane);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t bk[4], bv[4];
        load_b_nk(bk, Kb, LD, np * 16, kd * 16, lane);
        load_b_nk(bv, Vb, LD, np * 16, kd * 16, lane);
        mma16816<T>(s[2 * np], qa, bk[0], bk[1]);
        mma16816<T>(s[2 * np + 1], qa, bk[2], bk[3]);
        mma16816<T>(dp[2 * np], ga, bv[0], bv[1]);
        mma16816<T>(dp[2 * np + 1], ga, bv[2], bv[3]);
      }
    }

    const int n0 = nb * BN;
    const bool need_mask = n0 + BN > a.Tk || (a.causal && n0 + BN - 1 > m0 + a.shift);
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;
        float p = exp2f(s[j][e] * a.scale_log2 - lse2[i]);
        if (need_mask) {
          const int col = n0 + j * 8 + 2 * t4 + (e & 1), row = m0 + rl + 8 * i;
          if (col >= a.Tk || (a.causal && col > row + a.shift)) p = 0.f;
        }
        s[j][e] = p * (dp[j][e] - dlt[i]);  // dS without the scale
      }
    }

#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t sa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                              pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t bk[4];
        load_b_kn(bk, Kb, LD, kk * 16, dd * 16, lane);
        mma16816<T>(dq[2 * dd], sa, bk[0], bk[1]);
        mma16816<T>(dq[2 * dd + 1], sa, bk[2], bk[3]);
      }
    }
    cp_async_wait_all();
    __syncthreads();
  }

  T* dqp = static_cast<T*>(a.dq) + qrow0 * D;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rl + 8 * i;
    if (r < valid) {
      T* row = dqp + static_cast<int64_t>(r) * D + 2 * t4;
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        store2<T>(row + j * 8, dq[j][2 * i] * a.scale, dq[j][2 * i + 1] * a.scale);
      }
    }
  }
}

template <typename Kernel>
void set_smem(Kernel kernel, size_t smem) {
  TD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
}

template <typename T, int D, int kWarpsKv, int BMkv, int kWarpsQ>
void launch_bwd(const BwdArgs& a, const AttentionShape& s, cudaStream_t stream) {
  using Kv = DkvCfg<D, kWarpsKv, BMkv>;
  using Q = DqCfg<D, kWarpsQ>;
  {
    const size_t smem = Kv::template smem_bytes<T>();
    auto kernel = flash_bwd_dkdv_kernel<T, D, kWarpsKv, BMkv>;
    set_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(s.B * s.Hkv),
                    static_cast<unsigned>(ceil_div(s.Tk, Kv::kBlockN)));
    kernel<<<grid, Kv::kThreads, smem, stream>>>(a);
    TD_CUDA_LAUNCH_CHECK();
  }
  {
    const size_t smem = Q::template smem_bytes<T>();
    auto kernel = flash_bwd_dq_kernel<T, D, kWarpsQ>;
    set_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(s.B * s.H),
                    static_cast<unsigned>(ceil_div(s.Tq, Q::kBlockM)));
    kernel<<<grid, Q::kThreads, smem, stream>>>(a);
    TD_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace

template <typename T>
void attention_backward_tc(const T* grad_out, const T* q, const T* k, const T* v, const float* lse,
                           const float* delta, T* dq, T* dk, T* dv, const AttentionShape& s,
                           cudaStream_t stream) {
  BwdArgs a{grad_out,
            q,
            k,
            v,
            lse,
            delta,
            dq,
            dk,
            dv,
            static_cast<int>(s.H),
            static_cast<int>(s.Hkv),
            static_cast<int>(s.H / s.Hkv),
            static_cast<int>(s.Tq),
            static_cast<int>(s.Tk),
            static_cast<int>(s.Tk - s.Tq),
            s.causal,
            s.scale,
            s.scale * attn::kLog2e};
  if (s.D == 64) {
    launch_bwd<T, 64, 4, 64, 4>(a, s, stream);
  } else {
    launch_bwd<T, 128, 4, 64, 4>(a, s, stream);
  }
}

template void attention_backward_tc<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                   const __nv_bfloat16*, const __nv_bfloat16*,
                                                   const float*, const float*, __nv_bfloat16*,
                                                   __nv_bfloat16*, __nv_bfloat16*,
                                                   const AttentionShape&, cudaStream_t);
template void attention_backward_tc<__half>(const __half*, const __half*, const __half*,
                                            const __half*, const float*, const float*, __half*,
                                            __half*, __half*, const AttentionShape&, cudaStream_t);

}  // namespace td::kernels
