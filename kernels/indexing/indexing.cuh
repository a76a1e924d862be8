#pragma once
// index_select (a gather of rows along a dim) and index_add (its deterministic adjoint), the
// launchers behind src/ops/indexing.cpp on CUDA. Arrays are contiguous [outer, mid, inner]
// (the input) and [outer, n, inner] (the selected rows / the source), idx has n entries.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace td::kernels {

// Writes to the 8 scratch bytes the first position i with idx[i] outside [0, size), or all ones
// (~0ULL) when every index is valid, without reading it back (Note [Deferred device checks] in
// runtime/deferred_checks.cuh).
template <typename I>
void mark_bad_index(const I* idx, int64_t n, int64_t size, void* scratch, cudaStream_t stream);

// The first position i with idx[i] outside [0, size), or -1 when every index is valid; the
// offending value goes to *bad_value. Reads the answer back, so it synchronizes the stream.
// scratch: 8 bytes of device memory. I: int32_t or int64_t.
template <typename I>
int64_t find_bad_index(const I* idx, int64_t n, int64_t size, void* scratch, int64_t* bad_value,
                       cudaStream_t stream);

// out[o, i, c] = x[o, idx[i], c] for elements of elem_bytes (1, 2, 4 or 8) bytes; an index outside
// [0, mid) gathers zeros (its caller reports it: find_bad_index or mark_bad_index).
template <typename I>
void index_select(const void* x, void* out, const I* idx, int64_t outer, int64_t mid, int64_t n,
                  int64_t inner, size_t elem_bytes, cudaStream_t stream);

// Scratch bytes index_add needs for n indices into a dim of size mid.
size_t index_add_scratch_bytes(int64_t n, int64_t mid);

// out[o, j, c] = x[o, j, c] + sum of src[o, i, c] over the i with idx[i] == j, added one at a
// time in increasing i in fp32 (bf16/f16) or T (float, int32, int64), rounded once: exactly
// the CPU backend's order, so results match it bitwise. The indices are sorted stably (a radix
// sort of (idx[i], i) pairs), so no atomics are involved. Every index already checked.
template <typename T, typename I>
void index_add(const T* x, const T* src, const I* idx, T* out, int64_t outer, int64_t mid,
               int64_t n, int64_t inner, void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace td::kernels
