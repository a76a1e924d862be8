#pragma once
// Reductions over the middle axis of a contiguous [outer, r, inner] array (sum, mean, max/min
// with indices, var, norm), the launchers behind src/ops/reduction.cpp on CUDA.
//
// Note [CUDA reduction order]: every output element is reduced in an order fixed by the shape
// alone (never by the device, the grid or timing), so results are bitwise reproducible:
//   - the r axis may be split into `nsplit` chunks of `chunk` elements (only when there are too
//     few outputs to fill the GPU); each chunk is reduced by a warp, a block, or (inner > 1)
//     a 32x8 thread tile, each thread accumulating a fixed strided subset in increasing order,
//     then combined by a fixed shuffle/shared-memory tree;
//   - the per-chunk partials go to scratch and a second launch combines them in chunk order.
// Sums accumulate in double for floating inputs (as the CPU backend does) and in int64 for
// integers; max/min carry (value, index) pairs and prefer NaN, then the smaller index, so they
// return the first extremum exactly as the CPU does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace td::kernels {

struct ReduceDims {
  int64_t outer = 1, r = 1, inner = 1;
};

// The output element type of a sum: the input's for floating types, int64 for integers and bool.
template <typename T>
using sum_out_t = std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> ||
                                         std::is_same_v<T, __half>,
                                     T, int64_t>;

// Bytes of scratch memory (256-byte aligned base) a launcher below needs for these dims; with
// for_var, also room for reduce_var's per-output means.
size_t reduce_scratch_bytes(ReduceDims d, bool for_var = false);

// out[o, c] = scale * sum_r x[o, r, c]. T: float, bf16, half, int32, int64, bool. For integers
// scale must be 1 (no mean of integers).
template <typename T>
void reduce_sum(const T* x, sum_out_t<T>* out, ReduceDims d, double scale, void* scratch,
                cudaStream_t stream);

// values[o, c] = max (or min) over r of x[o, r, c]; indices (optional, nullptr for none) the r of
// the first extremum; a NaN wins (the first NaN). d.r must be > 0. T as for reduce_sum.
template <typename T>
void reduce_extremum(const T* x, T* values, int64_t* indices, ReduceDims d, bool is_max,
                     void* scratch, cudaStream_t stream);

// out[o, c] = sum_r (x - mean)^2 / divisor, two passes in double (mean, then centred squares).
// d.r must be > 0. T: float, bf16, half.
template <typename T>
void reduce_var(const T* x, T* out, ReduceDims d, double divisor, void* scratch,
                cudaStream_t stream);

// out[0] = sqrt(sum of x[i]^2), the sum in double; n may be 0. T: float, bf16, half.
template <typename T>
void reduce_norm(const T* x, T* out, int64_t n, void* scratch, cudaStream_t stream);

// z[i, j] = j == idx[i] ? g[i] : 0 for a [rows, n] z (the gradient of max along a dim, in the
// rows layout). T: float, bf16, half.
template <typename T>
void max_backward_rows(const T* g, const int64_t* idx, T* z, int64_t rows, int64_t n,
                       cudaStream_t stream);

}  // namespace td::kernels
