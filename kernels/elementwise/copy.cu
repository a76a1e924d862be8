// Copy/cast, fill, where, masked_fill and tril/triu on the elementwise engine.
#include "elementwise/elementwise.cuh"
#include "elementwise/loops.cuh"

namespace td::kernels {

namespace ew {
namespace {

// The CPU's cast: static_cast<acc_t<TD>>(acc_t<TS> v), then stored as TD.
template <typename AO>
struct CastF {
  template <typename A>
  __device__ AO operator()(A v) const {
    return static_cast<AO>(v);
  }
};

template <typename U>
struct FillF {
  U bits;
  __device__ U operator()() const { return bits; }
};

template <typename A>
struct MaskedFillF {
  A value;
  __device__ A operator()(A x, bool m) const { return m ? value : x; }
};

struct WhereF {
  template <typename A>
  __device__ A operator()(bool c, A x, A y) const {
    return c ? x : y;
  }
};

template <typename U>
__global__ void triangle_kernel(U* __restrict__ out, const U* __restrict__ in, int64_t n, int64_t R,
                                int64_t C, bool upper, int64_t k) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const int64_t r = e / C;
    const int64_t j = e - r * C;
    const int64_t d = j - r % R;
    const bool keep = upper ? d >= k : d <= k;
    out[e] = keep ? in[e] : U(0);
  }
}

}  // namespace
}  // namespace ew

void ew_cast(const EwArgs& a, EwType dst, EwType src, cudaStream_t stream) {
  ew::dispatch_all(dst, [&]<typename TO>() {
    ew::dispatch_all(src, [&]<typename TI>() {
      ew::launch<ew::CastF<ew::acc<TO>>, TO, TI>(a, ew::CastF<ew::acc<TO>>{}, stream);
    });
  });
}

namespace ew {
namespace {

// Calls body.template operator()<T>() with the storage type of t; FP8 stores saturate or not.
template <bool Saturate, typename Body>
void dispatch_cast(CastType t, Body&& body) {
  switch (t) {
    case CastType::F8E4M3FN:
      return body.template operator()<Fp8<Fp8Kind::E4M3FN, Saturate>>();
    case CastType::F8E5M2:
      return body.template operator()<Fp8<Fp8Kind::E5M2, Saturate>>();
    default:
      return dispatch_all(static_cast<EwType>(t), body);
  }
}

constexpr bool is_fp8(CastType t) {
  return t == CastType::F8E4M3FN || t == CastType::F8E5M2;
}

}  // namespace
}  // namespace ew

void ew_cast_fp8(const EwArgs& a, CastType dst, CastType src, bool saturate, cudaStream_t stream) {
  if (!ew::is_fp8(dst) && !ew::is_fp8(src)) {
    return ew_cast(a, static_cast<EwType>(dst), static_cast<EwType>(src), stream);
  }
  if (dst == src) {  // bytes: decoding and re-encoding would canonicalize E5M2's NaN codes
    return ew::launch<ew::CastF<uint8_t>, uint8_t, uint8_t>(a, ew::CastF<uint8_t>{}, stream);
  }
  auto cast = [&]<typename TO>() {
    ew::dispatch_cast<false>(src, [&]<typename TI>() {
      if constexpr (ew::kIsFp8<TO> || ew::kIsFp8<TI>) {  // the other pairs are ew_cast's
        ew::launch<ew::CastF<ew::acc<TO>>, TO, TI>(a, ew::CastF<ew::acc<TO>>{}, stream);
      }
    });
  };
  if (saturate) {
    ew::dispatch_cast<true>(dst, cast);
  } else {
    ew::dispatch_cast<false>(dst, cast);
  }
}

namespace ew {
namespace {

struct ScaleF {
  float scale;
  template <typename A>
  __device__ float operator()(A v) const {
    return __fmul_rn(static_cast<float>(v), scale);  // one rounded product, never contracted
  }
};

}  // namespace
}  // namespace ew

void ew_scale_cast_fp8(const EwArgs& a, CastType dst, CastType src, float scale,
                       cudaStream_t stream) {
  auto run = [&]<typename TO>() {
    if constexpr (ew::kIsFp8<TO>) {
      switch (src) {
        case CastType::F32:
          return ew::launch<ew::ScaleF, TO, float>(a, ew::ScaleF{scale}, stream);
        case CastType::BF16:
          return ew::launch<ew::ScaleF, TO, __nv_bfloat16>(a, ew::ScaleF{scale}, stream);
        case CastType::F16:
          return ew::launch<ew::ScaleF, TO, __half>(a, ew::ScaleF{scale}, stream);
        default:
          break;
      }
    }
  };
  if (dst == CastType::F8E4M3FN) {
    run.template operator()<Fp8<Fp8Kind::E4M3FN, true>>();
  } else if (dst == CastType::F8E5M2) {
    run.template operator()<Fp8<Fp8Kind::E5M2, true>>();
  }
}

void ew_fill(const EwArgs& a, int elem_bytes, uint64_t bits, cudaStream_t stream) {
  switch (elem_bytes) {
    case 1:
      return ew::launch<ew::FillF<uint8_t>, uint8_t>(a, {static_cast<uint8_t>(bits)}, stream);
    case 2:
      return ew::launch<ew::FillF<uint16_t>, uint16_t>(a, {static_cast<uint16_t>(bits)}, stream);
    case 4:
      return ew::launch<ew::FillF<uint32_t>, uint32_t>(a, {static_cast<uint32_t>(bits)}, stream);
    case 8:
      return ew::launch<ew::FillF<uint64_t>, uint64_t>(a, {bits}, stream);
    default:
      break;
  }
}

void ew_masked_fill(const EwArgs& a, EwType t, double value, cudaStream_t stream) {
  ew::dispatch_all(t, [&]<typename T>() {
    using A = ew::acc<T>;
    ew::launch<ew::MaskedFillF<A>, T, T, bool>(a, ew::MaskedFillF<A>{static_cast<A>(value)},
                                               stream);
  });
}

void ew_where(const EwArgs& a, EwType t, cudaStream_t stream) {
  ew::dispatch_all(t, [&]<typename T>() { ew::launch<ew::WhereF, T, bool, T, T>(a, {}, stream); });
}

void ew_triangle(void* out, const void* in, int64_t rows, int64_t R, int64_t C, int elem_bytes,
                 bool upper, int64_t k, cudaStream_t stream) {
  const int64_t n = rows * C;
  if (n <= 0) return;
  const unsigned grid = grid_for(n, ew::kThreads);
  auto run = [&]<typename U>() {
    ew::triangle_kernel<U><<<grid, ew::kThreads, 0, stream>>>(
        static_cast<U*>(out), static_cast<const U*>(in), n, R, C, upper, k);
    TD_CUDA_LAUNCH_CHECK();
  };
  switch (elem_bytes) {
    case 1:
      return run.template operator()<uint8_t>();
    case 2:
      return run.template operator()<uint16_t>();
    case 4:
      return run.template operator()<uint32_t>();
    case 8:
      return run.template operator()<uint64_t>();
    default:
      break;
  }
}

}  // namespace td::kernels
