#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "common/cuda_types.cuh"
#include "indexing/indexing.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {
namespace {

constexpr int kThreads = 256;

constexpr size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

template <typename I>
__global__ void find_bad_index_kernel(const I* idx, int64_t n, int64_t size,
                                      unsigned long long* first) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    // An integer minimum: the same answer whatever the order of the atomics.
    if (v < 0 || v >= size) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

// ---- index_select: a row gather, moved as words of E (1 to 16 bytes) ----

template <typename E, typename I>
__global__ void gather_kernel(const E* x, E* out, const I* idx, int64_t mid, int64_t n,
                              int64_t inner, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t c = e % inner, t = e / inner;
    const int64_t i = t % n, o = t / n;
    // An out-of-range index gathers zeros (Note [Deferred device checks] reports it).
    const auto k = static_cast<int64_t>(idx[i]);
    out[e] = k >= 0 && k < mid ? x[(o * mid + k) * inner + c] : E{};
  }
}

template <typename E, typename I>
void launch_gather(const void* x, void* out, const I* idx, int64_t outer, int64_t mid, int64_t n,
                   int64_t inner_words, cudaStream_t stream) {
  const int64_t total = outer * n * inner_words;
  gather_kernel<E, I><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
      static_cast<const E*>(x), static_cast<E*>(out), idx, mid, n, inner_words, total);
  TD_CUDA_LAUNCH_CHECK();
}

// ---- index_add ----

int key_bits(int64_t mid) {
  int b = 1;
  while (b < 63 && (int64_t{1} << b) < mid) ++b;
  return b;
}

size_t sort_temp_bytes(int64_t n, int64_t mid) {
  size_t bytes = 0;
  TD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n, 0, key_bits(mid)));
  return bytes;
}

template <typename I>
__global__ void make_pairs_kernel(const I* idx, uint64_t* keys, int64_t* vals, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    keys[i] = static_cast<uint64_t>(static_cast<int64_t>(idx[i]));  // checked: in [0, mid)
    vals[i] = i;
  }
}

template <typename T>
inline constexpr bool kIsFloat =
    std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;
template <typename T>
using add_acc_t = std::conditional_t<kIsFloat<T>, float, T>;

template <typename T>
__device__ __forceinline__ add_acc_t<T> to_acc(T v) {
  if constexpr (kIsFloat<T>) {
    return to_float(v);
  } else {
    return v;
  }
}
template <typename T>
__device__ __forceinline__ T from_acc(add_acc_t<T> a) {
  if constexpr (kIsFloat<T>) {
    return from_float<T>(a);
  } else {
    return a;
  }
}

// One thread per output element: x plus its sources in increasing source position (the sorted
// pairs with key j are contiguous and, the sort being stable, in increasing i).
template <typename T>
__global__ void index_add_kernel(const T* x, const T* src, const uint64_t* keys,
                                 const int64_t* rows, T* out, int64_t outer, int64_t mid, int64_t n,
                                 int64_t inner) {
  const int64_t total = outer * mid * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t c = e % inner, t = e / inner;
    const int64_t j = t % mid, o = t / mid;
    const uint64_t key = static_cast<uint64_t>(j);
    int64_t lo = 0, hi = n;  // first sorted position with keys[pos] >= key
    while (lo < hi) {
      const int64_t m = lo + (hi - lo) / 2;
      if (keys[m] < key) {
        lo = m + 1;
      } else {
        hi = m;
      }
    }
    add_acc_t<T> acc = to_acc(x[e]);
    for (int64_t k = lo; k < n && keys[k] == key; ++k) {
      acc += to_acc(src[(o * n + rows[k]) * inner + c]);
    }
    out[e] = from_acc<T>(acc);
  }
}

}  // namespace

template <typename I>
void mark_bad_index(const I* idx, int64_t n, int64_t size, void* scratch, cudaStream_t stream) {
  auto* first = static_cast<unsigned long long*>(scratch);
  TD_CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof(*first), stream));
  if (n == 0) return;
  find_bad_index_kernel<I><<<grid_for(n, kThreads), kThreads, 0, stream>>>(idx, n, size, first);
  TD_CUDA_LAUNCH_CHECK();
}

template <typename I>
int64_t find_bad_index(const I* idx, int64_t n, int64_t size, void* scratch, int64_t* bad_value,
                       cudaStream_t stream) {
  if (n == 0) return -1;
  auto* first = static_cast<unsigned long long*>(scratch);
  mark_bad_index<I>(idx, n, size, scratch, stream);
  unsigned long long pos = 0;
  TD_CUDA_CHECK(cudaMemcpyAsync(&pos, first, sizeof(pos), cudaMemcpyDeviceToHost, stream));
  TD_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (pos == ~0ULL) return -1;
  I v = 0;
  TD_CUDA_CHECK(cudaMemcpyAsync(&v, idx + pos, sizeof(I), cudaMemcpyDeviceToHost, stream));
  TD_CUDA_CHECK(cudaStreamSynchronize(stream));
  *bad_value = static_cast<int64_t>(v);
  return static_cast<int64_t>(pos);
}

template <typename I>
void index_select(const void* x, void* out, const I* idx, int64_t outer, int64_t mid, int64_t n,
                  int64_t inner, size_t elem_bytes, cudaStream_t stream) {
  if (outer * n * inner == 0) return;
  // The widest word that divides a row and fits both pointers' alignment.
  const size_t row_bytes = static_cast<size_t>(inner) * elem_bytes;
  size_t w = 16;
  while (w > 1 && (row_bytes % w != 0 || reinterpret_cast<uintptr_t>(x) % w != 0 ||
                   reinterpret_cast<uintptr_t>(out) % w != 0)) {
    w /= 2;
  }
  const auto words = static_cast<int64_t>(row_bytes / w);
  switch (w) {
    case 16:
      return launch_gather<uint4, I>(x, out, idx, outer, mid, n, words, stream);
    case 8:
      return launch_gather<uint64_t, I>(x, out, idx, outer, mid, n, words, stream);
    case 4:
      return launch_gather<uint32_t, I>(x, out, idx, outer, mid, n, words, stream);
    case 2:
      return launch_gather<uint16_t, I>(x, out, idx, outer, mid, n, words, stream);
    default:
      return launch_gather<uint8_t, I>(x, out, idx, outer, mid, n, words, stream);
  }
}

size_t index_add_scratch_bytes(int64_t n, int64_t mid) {
  if (n == 0) return 0;
  return 4 * align256(static_cast<size_t>(n) * 8) + align256(sort_temp_bytes(n, mid));
}

template <typename T, typename I>
void index_add(const T* x, const T* src, const I* idx, T* out, int64_t outer, int64_t mid,
               int64_t n, int64_t inner, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  const int64_t total = outer * mid * inner;
  if (total == 0) return;
  uint64_t* keys_sorted = nullptr;
  int64_t* rows_sorted = nullptr;
  if (n > 0) {
    const size_t a = align256(static_cast<size_t>(n) * 8);
    char* base = static_cast<char*>(scratch);
    auto* keys_in = reinterpret_cast<uint64_t*>(base);
    keys_sorted = reinterpret_cast<uint64_t*>(base + a);
    auto* rows_in = reinterpret_cast<int64_t*>(base + 2 * a);
    rows_sorted = reinterpret_cast<int64_t*>(base + 3 * a);
    size_t temp_bytes = scratch_bytes - 4 * a;
    make_pairs_kernel<I><<<grid_for(n, kThreads), kThreads, 0, stream>>>(idx, keys_in, rows_in, n);
    TD_CUDA_LAUNCH_CHECK();
    TD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * a, temp_bytes, keys_in, keys_sorted,
                                                  rows_in, rows_sorted, n, 0, key_bits(mid),
                                                  stream));
  }
  index_add_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
      x, src, keys_sorted, rows_sorted, out, outer, mid, n, inner);
  TD_CUDA_LAUNCH_CHECK();
}

#define TD_INDEXING_BY_INDEX(I)                                                                   \
  template void mark_bad_index<I>(const I*, int64_t, int64_t, void*, cudaStream_t);               \
  template int64_t find_bad_index<I>(const I*, int64_t, int64_t, void*, int64_t*, cudaStream_t);  \
  template void index_select<I>(const void*, void*, const I*, int64_t, int64_t, int64_t, int64_t, \
                                size_t, cudaStream_t);
TD_INDEXING_BY_INDEX(int32_t)
TD_INDEXING_BY_INDEX(int64_t)

#define TD_INDEX_ADD(T, I)                                                                   \
  template void index_add<T, I>(const T*, const T*, const I*, T*, int64_t, int64_t, int64_t, \
                                int64_t, void*, size_t, cudaStream_t);
#define TD_INDEX_ADD_BOTH(T) TD_INDEX_ADD(T, int32_t) TD_INDEX_ADD(T, int64_t)
TD_KERNELS_FOR_FLOATING(TD_INDEX_ADD_BOTH)
TD_INDEX_ADD_BOTH(int32_t)
TD_INDEX_ADD_BOTH(int64_t)
#undef TD_INDEXING_BY_INDEX
#undef TD_INDEX_ADD
#undef TD_INDEX_ADD_BOTH

}  // namespace td::kernels
