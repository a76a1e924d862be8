// Tensor-core attention forward (FlashAttention-2): one CTA of kWarps warps per (query tile of
// 16 * kWarps rows, batch * head); each warp owns 16 query rows. Key/value tiles of kBlockN rows
// are double-buffered through shared memory by cp.async. Per tile: S = Q K^T (mma.sync, fp32),
// scaled by scale * log2(e), masked on the causal diagonal and past Tk; online softmax with exp2
// (running row max m and per-thread partial row sums l, rescaling O by exp2(m_old - m_new));
// O += P V with P rounded to the input type and fed to the mma from registers (Note [mma.sync
// fragments]). Tiles entirely above the causal diagonal are never loaded.
#include "attention/flash_attention.cuh"
#include "attention/flash_attention_mma.cuh"
#include "common/cuda_types.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {

namespace {

using namespace attn;

struct FwdArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  int H, group, Tq, Tk, shift;  // shift = Tk - Tq (causal alignment)
  bool causal;
  float scale_log2;  // scale * log2(e)
};

template <int D, int kWarps>
struct FwdCfg {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kBlockN = 64;
  static constexpr int kLd = D + kPad;
  // Q, then two buffers each of K and V.
  template <typename T>
  static constexpr size_t smem_bytes() {
    return static_cast<size_t>(kBlockM + 4 * kBlockN) * kLd * sizeof(T);
  }
};

template <typename T, int D, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) flash_fwd_kernel(const FwdArgs a) {
  using Cfg = FwdCfg<D, kWarps>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, LD = Cfg::kLd, NT = Cfg::kThreads;
  constexpr int kDT = D / 8;   // 8-wide output column tiles
  constexpr int kNT = BN / 8;  // 8-wide score column tiles
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* Ks = Qs + BM * LD;      // two buffers of BN * LD
  T* Vs = Ks + 2 * BN * LD;  // two buffers of BN * LD

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x;  // b * H + h
  const int hkv = (bh / a.H) * (a.H / a.group) + (bh % a.H) / a.group;
  // The heaviest causal tiles (largest m0) go first.
  const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const T* q = static_cast<const T*>(a.q) + (static_cast<int64_t>(bh) * a.Tq + m0) * D;
  const T* k = static_cast<const T*>(a.k) + static_cast<int64_t>(hkv) * a.Tk * D;
  const T* v = static_cast<const T*>(a.v) + static_cast<int64_t>(hkv) * a.Tk * D;

  // Keys [0, n_end) are visible to some row of this tile; n_end >= 1 (every row sees key 0).
  const int n_end = a.causal ? min(a.Tk, m0 + BM + a.shift) : a.Tk;
  const int n_blocks = (n_end + BN - 1) / BN;

  load_tile<T, BM, D, NT>(Qs, q, min(BM, a.Tq - m0), tid);
  load_tile<T, BN, D, NT>(Ks, k, min(BN, a.Tk), tid);
  load_tile<T, BN, D, NT>(Vs, v, min(BN, a.Tk), tid);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) load_a(qf[kd], Qs, LD, warp * 16, kd * 16, lane);

  float o[kDT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const int row0 = m0 + warp * 16 + g;  // rows row0 and row0 + 8

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

    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b[4];
        load_b_nk(b, Kb, LD, np * 16, kd * 16, lane);
        mma16816<T>(s[2 * np], qf[kd], b[0], b[1]);
        mma16816<T>(s[2 * np + 1], qf[kd], b[2], b[3]);
      }
    }

    const int n0 = nb * BN;
    const bool need_mask = n0 + BN > a.Tk || (a.causal && n0 + BN - 1 > m0 + a.shift);
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * a.scale_log2;
        if (need_mask) {
          const int col = n0 + j * 8 + 2 * t4 + (e & 1);
          const int row = row0 + (e >> 1) * 8;
          if (col >= a.Tk || (a.causal && col > row + a.shift)) x = -INFINITY;
        }
        s[j][e] = x;
      }
    }

    float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
    float base[2], alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = quad_max(mx[i]);
      base[i] = mx[i] == -INFINITY ? 0.f : mx[i];  // a row with nothing visible yet stays 0
      alpha[i] = exp2f(m_run[i] - base[i]);        // 0 when m_run = -inf
      m_run[i] = mx[i];
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      s[j][0] = exp2f(s[j][0] - base[0]);
      s[j][1] = exp2f(s[j][1] - base[0]);
      s[j][2] = exp2f(s[j][2] - base[1]);
      s[j][3] = exp2f(s[j][3] - base[1]);
      rs[0] += s[j][0] + s[j][1];
      rs[1] += s[j][2] + s[j][3];
    }
    l_run[0] = l_run[0] * alpha[0] + rs[0];
    l_run[1] = l_run[1] * alpha[1] + rs[1];
#pragma unroll
    for (int j = 0; j < kDT; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }

#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                              pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        load_b_kn(b, Vb, LD, kk * 16, dp * 16, lane);
        mma16816<T>(o[2 * dp], pa, b[0], b[1]);
        mma16816<T>(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
    cp_async_wait_all();
    __syncthreads();  // the next tile is in; nobody reads this buffer any more
  }

  T* out = static_cast<T*>(a.out) + static_cast<int64_t>(bh) * a.Tq * D;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = quad_sum(l_run[i]);
    const int row = row0 + 8 * i;
    if (row < a.Tq) {
      const float inv = 1.f / l;
      T* orow = out + static_cast<int64_t>(row) * D + 2 * t4;
#pragma unroll
      for (int j = 0; j < kDT; ++j)
        store2<T>(orow + j * 8, o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
      if (t4 == 0) a.lse[static_cast<int64_t>(bh) * a.Tq + row] = (m_run[i] + log2f(l)) * kLn2;
    }
  }
}

template <typename T, int D, int kWarps>
void launch_fwd(const FwdArgs& a, int64_t BH, int64_t Tq, cudaStream_t stream) {
  using Cfg = FwdCfg<D, kWarps>;
  const size_t smem = Cfg::template smem_bytes<T>();
  auto kernel = flash_fwd_kernel<T, D, kWarps>;
  TD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(BH), static_cast<unsigned>(ceil_div(Tq, Cfg::kBlockM)));
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(a);
  TD_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename T>
void attention_forward_tc(const T* q, const T* k, const T* v, T* out, float* lse,
                          const AttentionShape& s, cudaStream_t stream) {
  FwdArgs a{q,
            k,
            v,
            out,
            lse,
            static_cast<int>(s.H),
            static_cast<int>(s.H / s.Hkv),
            static_cast<int>(s.Tq),
            static_cast<int>(s.Tk),
            static_cast<int>(s.Tk - s.Tq),
            s.causal,
            s.scale * attn::kLog2e};
  if (s.D == 64) {
    launch_fwd<T, 64, 4>(a, s.B * s.H, s.Tq, stream);
  } else {
    launch_fwd<T, 128, 4>(a, s.B * s.H, s.Tq, stream);
  }
}

template void attention_forward_tc<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                  const __nv_bfloat16*, __nv_bfloat16*, float*,
                                                  const AttentionShape&, cudaStream_t);
template void attention_forward_tc<__half>(const __half*, const __half*, const __half*, __half*,
                                           float*, const AttentionShape&, cudaStream_t);

}  // namespace td::kernels
