#include <cub/device/device_radix_sort.cuh>

#include "common/cuda_types.cuh"
#include "embedding/embedding.cuh"
#include "runtime/cuda_check.cuh"

namespace td::kernels {

namespace {

constexpr int kThreads = 256;
constexpr size_t kAlign = 256;  // every scratch sub-buffer starts on a 256-byte boundary

size_t align_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// An out-of-range index becomes key `num`, which sorts after every row's positions and belongs
// to no row: its gradient row is dropped (Note [Deferred device checks] reports it).
template <typename IndexT>
__global__ void prepare_pairs_kernel(const IndexT* __restrict__ indices, int64_t n, int64_t num,
                                     int64_t* __restrict__ keys, int64_t* __restrict__ positions) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const auto k = static_cast<int64_t>(indices[i]);
    keys[i] = k >= 0 && k < num ? k : num;
    positions[i] = i;
  }
}

// starts[v] = the first k with sorted_keys[k] >= v, for v in [0, num]; so vocab row v owns
// sorted positions [starts[v], starts[v + 1]).
__global__ void segment_starts_kernel(const int64_t* __restrict__ sorted_keys, int64_t n,
                                      int64_t num, int64_t* __restrict__ starts) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v <= num;
       v += stride) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted_keys[mid] < v) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    starts[v] = lo;
  }
}

// One block per vocab row (grid-stride over rows), one thread per column: the row's gradient
// rows are added in sorted (= position) order, as the CPU backend adds them.
template <typename T>
__global__ void accumulate_rows_kernel(const T* __restrict__ grad,
                                       const int64_t* __restrict__ positions,
                                       const int64_t* __restrict__ starts, T* __restrict__ out,
                                       int64_t num, int64_t dim) {
  for (int64_t v = blockIdx.x; v < num; v += gridDim.x) {
    const int64_t b = starts[v], e = starts[v + 1];
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      float acc = 0.0f;
      int64_t k = b;
      // Loads of four rows are issued before their (ordered) additions.
      for (; k + 4 <= e; k += 4) {
        const float x0 = to_float(grad[positions[k] * dim + j]);
        const float x1 = to_float(grad[positions[k + 1] * dim + j]);
        const float x2 = to_float(grad[positions[k + 2] * dim + j]);
        const float x3 = to_float(grad[positions[k + 3] * dim + j]);
        acc += x0;
        acc += x1;
        acc += x2;
        acc += x3;
      }
      for (; k < e; ++k) acc += to_float(grad[positions[k] * dim + j]);
      out[v * dim + j] = from_float<T>(acc);
    }
  }
}

// Bits of the radix sort: enough for keys in [0, num] (num: an out-of-range index).
int key_bits(int64_t num) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= num) ++bits;
  return bits;
}

size_t sort_temp_bytes(int64_t n, int64_t num) {
  size_t bytes = 0;
  TD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n, 0, key_bits(num)));
  return bytes;
}

}  // namespace

template <typename IndexT>
size_t embedding_backward_scratch_bytes(int64_t n, int64_t num_embeddings) {
  const size_t pairs = align_up(static_cast<size_t>(n) * sizeof(int64_t));
  const size_t starts = align_up(static_cast<size_t>(num_embeddings + 1) * sizeof(int64_t));
  const size_t temp = n > 0 ? align_up(sort_temp_bytes(n, num_embeddings)) : 0;
  return 4 * pairs + starts + temp;
}

template <typename T, typename IndexT>
void embedding_backward(const T* grad, const IndexT* indices, T* grad_weight, int64_t n,
                        int64_t num_embeddings, int64_t dim, void* scratch, size_t scratch_bytes,
                        cudaStream_t stream) {
  if (num_embeddings == 0 || dim == 0) return;
  char* base = static_cast<char*>(scratch);
  const size_t pairs = align_up(static_cast<size_t>(n) * sizeof(int64_t));
  const size_t starts_bytes = align_up(static_cast<size_t>(num_embeddings + 1) * sizeof(int64_t));
  int64_t* keys_in = reinterpret_cast<int64_t*>(base);
  int64_t* keys_out = reinterpret_cast<int64_t*>(base + pairs);
  int64_t* pos_in = reinterpret_cast<int64_t*>(base + 2 * pairs);
  int64_t* pos_out = reinterpret_cast<int64_t*>(base + 3 * pairs);
  int64_t* starts = reinterpret_cast<int64_t*>(base + 4 * pairs);
  void* temp = base + 4 * pairs + starts_bytes;
  const size_t used = 4 * pairs + starts_bytes;
  if (n > 0) {
    size_t temp_bytes = sort_temp_bytes(n, num_embeddings);
    if (used + temp_bytes > scratch_bytes) {
      TD_CUDA_CHECK(cudaErrorInvalidValue);  // the caller sized the scratch wrongly
    }
    prepare_pairs_kernel<IndexT><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        indices, n, num_embeddings, keys_in, pos_in);
    TD_CUDA_LAUNCH_CHECK();
    TD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, pos_in,
                                                  pos_out, n, 0, key_bits(num_embeddings), stream));
  }
  segment_starts_kernel<<<grid_for(num_embeddings + 1, kThreads), kThreads, 0, stream>>>(
      keys_out, n, num_embeddings, starts);
  TD_CUDA_LAUNCH_CHECK();
  const int threads = static_cast<int>(dim >= 256 ? 256 : ceil_div(dim, 32) * 32);
  const int64_t blocks = num_embeddings < (int64_t{1} << 20) ? num_embeddings : (int64_t{1} << 20);
  accumulate_rows_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      grad, pos_out, starts, grad_weight, num_embeddings, dim);
  TD_CUDA_LAUNCH_CHECK();
}

#define TD_EMBEDDING_INDEX(I) template size_t embedding_backward_scratch_bytes<I>(int64_t, int64_t);
TD_EMBEDDING_INDEX(int32_t)
TD_EMBEDDING_INDEX(int64_t)

#define TD_EMBEDDING_BACKWARD(T)                                                               \
  template void embedding_backward<T, int32_t>(const T*, const int32_t*, T*, int64_t, int64_t, \
                                               int64_t, void*, size_t, cudaStream_t);          \
  template void embedding_backward<T, int64_t>(const T*, const int64_t*, T*, int64_t, int64_t, \
                                               int64_t, void*, size_t, cudaStream_t);
TD_KERNELS_FOR_FLOATING(TD_EMBEDDING_BACKWARD)

}  // namespace td::kernels
