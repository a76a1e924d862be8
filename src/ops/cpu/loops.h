#pragma once
// CPU elementwise machinery shared by every elementwise-style op (internal header).
//
// Note [Elementwise loops]: an op calls map<TOut, TIn...>(out, f, {inputs}). Inputs are
// broadcast to out's shape (stride 0), then dims are coalesced: size-1 dims dropped and
// neighbouring dims merged where every operand is contiguous across them, so most calls become
// one flat loop. The flat range [0, numel) is split across OpenMP threads; each thread walks
// rows of the innermost dim. When all inner strides are 1 the inner loop is a plain indexed
// loop over T* that GCC vectorizes (bf16/f16 load/convert included: benchmarks/bench_elementwise
// measures it against memcpy bandwidth).
#include <omp.h>

#include <array>
#include <tuple>
#include <utility>

#include "tardelli/core/tensor.h"

namespace td::cpu {

inline constexpr int64_t kGrain = 32768;  // elements below which a loop stays on one thread
inline constexpr int kMaxDims = 16;

// Runs f(begin, end) over [0, n) split across threads; serial below `grain` or when nested.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  int max_threads = omp_get_max_threads();
  int64_t want = grain > 0 ? (n + grain - 1) / grain : max_threads;
  int nt = static_cast<int>(std::min<int64_t>(max_threads, want));
  if (nt <= 1 || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    int T = omp_get_num_threads();
    int64_t chunk = (n + T - 1) / T;
    int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) f(b, e);
  }
}

template <int N>
struct Geometry {
  int ndim = 0;
  std::array<int64_t, kMaxDims> sizes{};
  std::array<std::array<int64_t, kMaxDims>, N> strides{};  // in elements
  int64_t numel = 0;
};

// Broadcasts operand k (k >= 1) to shape and coalesces; operand 0 defines the shape.
template <int N>
Geometry<N> make_geometry(const std::array<const Tensor*, N>& ops) {
  const Shape& shape = ops[0]->sizes();
  TD_CHECK(static_cast<int>(shape.size()) <= kMaxDims, "elementwise: at most ", kMaxDims,
           " dims supported, got ", shape.size());
  std::array<Shape, N> st;
  st[0] = ops[0]->strides();
  for (int k = 1; k < N; ++k) st[k] = broadcast_strides(ops[k]->sizes(), ops[k]->strides(), shape);
  Geometry<N> g;
  g.numel = numel_of(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (g.ndim > 0) {
      int p = g.ndim - 1;
      bool mergeable = true;
      for (int k = 0; k < N; ++k) {
        if (g.strides[k][p] != st[k][d] * shape[d]) mergeable = false;
      }
      if (mergeable) {
        g.sizes[p] *= shape[d];
        for (int k = 0; k < N; ++k) g.strides[k][p] = st[k][d];
        continue;
      }
    }
    g.sizes[g.ndim] = shape[d];
    for (int k = 0; k < N; ++k) g.strides[k][g.ndim] = st[k][d];
    ++g.ndim;
  }
  if (g.ndim == 0) {
    g.ndim = 1;
    g.sizes[0] = 1;
    for (int k = 0; k < N; ++k) g.strides[k][0] = 0;
  }
  return g;
}

// Walks [begin, end) of the flattened geometry row by row; row(ptrs, count, inner_strides).
template <int N, typename Row>
void walk(const Geometry<N>& g, const std::array<char*, N>& base, const std::array<size_t, N>& isz,
          int64_t begin, int64_t end, Row&& row) {
  const int last = g.ndim - 1;
  const int64_t inner = g.sizes[last];
  std::array<int64_t, kMaxDims> idx{};
  int64_t rem = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rem % g.sizes[d];
    rem /= g.sizes[d];
  }
  std::array<int64_t, N> inner_st;
  for (int k = 0; k < N; ++k) inner_st[k] = g.strides[k][last];
  int64_t i = begin;
  while (i < end) {
    std::array<char*, N> p;
    for (int k = 0; k < N; ++k) {
      int64_t off = 0;
      for (int d = 0; d <= last; ++d) off += idx[d] * g.strides[k][d];
      p[k] = base[k] + off * static_cast<int64_t>(isz[k]);
    }
    int64_t cnt = std::min(inner - idx[last], end - i);
    row(p, cnt, inner_st);
    i += cnt;
    idx[last] += cnt;
    for (int d = last; d > 0 && idx[d] >= g.sizes[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

namespace detail {

template <typename TOut, typename... TIn, typename F, size_t... I>
inline void map_row(const std::array<char*, sizeof...(TIn) + 1>& p, int64_t n,
                    const std::array<int64_t, sizeof...(TIn) + 1>& st, F& f,
                    std::index_sequence<I...>) {
  TOut* __restrict__ o = reinterpret_cast<TOut*>(p[0]);
  std::tuple<const TIn*...> in{reinterpret_cast<const TIn*>(p[I + 1])...};
  bool contig = st[0] == 1 && ((st[I + 1] == 1) && ...);
  if (contig) {
    for (int64_t j = 0; j < n; ++j) {
      o[j] = static_cast<TOut>(f(static_cast<acc_t<TIn>>(std::get<I>(in)[j])...));
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      o[j * st[0]] =
          static_cast<TOut>(f(static_cast<acc_t<TIn>>(std::get<I>(in)[j * st[I + 1]])...));
    }
  }
}

}  // namespace detail

// out[i] = f(ins[0][i], ins[1][i], ...), inputs broadcast to out's shape. f receives values
// converted to acc_t<TIn> (float for bf16/f16) and its result is converted to TOut.
// out may have any strides (it is written in place) but must not overlap an input partially.
template <typename TOut, typename... TIn, typename F>
void map(const Tensor& out, F f, const std::array<Tensor, sizeof...(TIn)>& ins) {
  constexpr int N = sizeof...(TIn) + 1;
  std::array<const Tensor*, N> ops;
  ops[0] = &out;
  for (int k = 1; k < N; ++k) ops[k] = &ins[k - 1];
  Geometry<N> g = make_geometry<N>(ops);
  std::array<char*, N> base;
  std::array<size_t, N> isz;
  for (int k = 0; k < N; ++k) {
    base[k] = static_cast<char*>(ops[k]->data_ptr());
    isz[k] = ops[k]->element_size();
  }
  parallel_for(g.numel, kGrain, [&](int64_t b, int64_t e) {
    walk<N>(g, base, isz, b, e, [&](const std::array<char*, N>& p, int64_t n,
                                    const std::array<int64_t, N>& st) {
      detail::map_row<TOut, TIn...>(p, n, st, f, std::make_index_sequence<N - 1>{});
    });
  });
}

}  // namespace td::cpu
