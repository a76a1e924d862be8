#pragma once
// Warp-level building blocks of the tensor-core attention kernels (internal to
// kernels/attention/): mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate), ldmatrix fragment
// loads from shared memory, cp.async tile copies. sm_80 and newer.
//
// Note [mma.sync fragments]: with lane = 4 * g + t (g = lane / 4 in 0..7, t = lane % 4),
//   A (16 x 16, row-major) regs a0..a3 hold pairs (row, col..col+1):
//     a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8);
//   B (16 x 8, "col": indexed [k][n]) regs b0, b1 hold pairs (k..k+1, n): b0 (2t, g), b1 (2t + 8,
//   g); C (16 x 8 fp32) c0, c1 = (g, 2t), (g, 2t + 1); c2, c3 = (g + 8, 2t), (g + 8, 2t + 1).
// So the C fragments of two adjacent 8-column tiles, rounded to 16 bits, are exactly the A
// fragment of a 16-wide k step: a0 = C[0].(c0,c1), a1 = C[0].(c2,c3), a2 = C[1].(c0,c1),
// a3 = C[1].(c2,c3). That lets P (and dS) feed the next product straight from registers.
// ldmatrix.x4 loads four 8 x 8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i and
// register i receives, in every lane, (row g, cols 2t..2t+1) of matrix i, or with .trans
// (rows 2t..2t+1, col g), i.e. the transpose.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace td::kernels::attn {

// Padding of each shared-memory row, in elements: a row of D + 8 b16 is 4 words past a multiple of
// 32 banks (D = 64, 128), so the 8 rows one ldmatrix phase reads hit distinct banks, and rows stay
// 16-byte aligned for cp.async and ldmatrix.
inline constexpr int kPad = 8;

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "mma16816: bf16 or fp16 only");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as one register of two 16-bit values (lo in the low half: the lower column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// A fragment of rows [m0, m0 + 16) x cols [k0, k0 + 16) of a row-major tile (leading dim ld).
// Matrix i = (rows m0 + 8 (i & 1), cols k0 + 8 (i >> 1)) -> a0 .. a3.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* s, int ld, int m0, int k0,
                                       int lane) {
  const int i = lane >> 3;
  ldsm_x4(a, s + (m0 + (lane & 7) + (i & 1) * 8) * ld + k0 + (i >> 1) * 8);
}

// B fragments of two 8-wide n tiles [n0, n0 + 16) for k in [k0, k0 + 16), from a tile stored
// [n][k] row-major (e.g. K for Q K^T: n = key, k = head dim). Matrix i = (rows n0 + 8 (i >> 1),
// cols k0 + 8 (i & 1)): b[0], b[1] = tile n0; b[2], b[3] = tile n0 + 8.
template <typename T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T* s, int ld, int n0, int k0,
                                          int lane) {
  const int i = lane >> 3;
  ldsm_x4(b, s + (n0 + (lane & 7) + (i >> 1) * 8) * ld + k0 + (i & 1) * 8);
}

// The same fragments from a tile stored [k][n] row-major (e.g. V for P V: k = key, n = head dim),
// transposed by ldmatrix: matrix i = (rows k0 + 8 (i & 1), cols n0 + 8 (i >> 1)).
template <typename T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T* s, int ld, int k0, int n0,
                                          int lane) {
  const int i = lane >> 3;
  ldsm_x4_trans(b, s + (k0 + (lane & 7) + (i & 1) * 8) * ld + n0 + (i >> 1) * 8);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Rows [0, ROWS) of a [*, D] global tile into shared memory (leading dim D + kPad), asynchronously:
// rows >= valid are zero-filled (plain stores), so padded keys and queries are finite zeros.
// Every thread of the block (NT of them) calls it; completion needs cp_async_commit, then
// cp_async_wait_all and __syncthreads.
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile(T* s, const T* g, int valid, int tid) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int kLd = D + kPad;
  constexpr int kTotal = ROWS * kChunksPerRow;
#pragma unroll
  for (int it = 0; it < (kTotal + NT - 1) / NT; ++it) {
    const int c = tid + it * NT;
    if (kTotal % NT != 0 && c >= kTotal) break;
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    T* dst = s + r * kLd + col;
    if (r < valid) {
      cp_async16(dst, g + static_cast<int64_t>(r) * D + col);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// Sum and max over the four lanes of a quad (the lanes holding one row of a C fragment).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Stores two adjacent values (cols c, c + 1, c even) of a row as one 32-bit write.
template <typename T>
__device__ __forceinline__ void store2(T* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = pack2<T>(lo, hi);
}

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

}  // namespace td::kernels::attn
