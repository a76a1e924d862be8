// One-input ops of the elementwise engine: math functions, tensor-scalar arithmetic, clamp,
// logical_not. Each functor mirrors the CPU lambda in src/ops/elementwise.cpp.
#include "elementwise/elementwise.cuh"
#include "elementwise/loops.cuh"

namespace td::kernels {

namespace ew {
namespace {

// Floating functions of one value (float compute type). CUDA's expf/logf/tanhf/sinf/cosf/powf
// are within a few ulp of the CPU's, not bitwise equal; sqrt and division are exact roundings.
template <EwOp kOp>
struct MathF {
  __device__ float operator()(float v) const {
    if constexpr (kOp == EwOp::Exp) return expf(v);
    if constexpr (kOp == EwOp::Log) return logf(v);
    if constexpr (kOp == EwOp::Tanh) return tanhf(v);
    if constexpr (kOp == EwOp::Sqrt) return sqrtf(v);
    if constexpr (kOp == EwOp::Rsqrt) return 1.0f / sqrtf(v);
    if constexpr (kOp == EwOp::Sigmoid) return 1.0f / add_rn(1.0f, expf(-v));
    if constexpr (kOp == EwOp::Sin) return sinf(v);
    if constexpr (kOp == EwOp::Cos) return cosf(v);
    if constexpr (kOp == EwOp::Square) return mul_rn(v, v);
  }
};

// Floating op with one float parameter.
template <EwOp kOp>
struct ParamF {
  float s;
  __device__ float operator()(float v) const {
    if constexpr (kOp == EwOp::DivScalar) return v / s;
    if constexpr (kOp == EwOp::RdivScalar) return s / v;
    if constexpr (kOp == EwOp::PowScalar) return powf(v, s);
    if constexpr (kOp == EwOp::RpowScalar) return powf(s, v);
  }
};

// Numeric ops: A is the compute type (float or an integer type).
template <EwOp kOp, typename A>
struct NumF {
  A s;
  __device__ A operator()(A v) const {
    if constexpr (kOp == EwOp::Neg) return -v;
    if constexpr (kOp == EwOp::Abs) return v < 0 ? -v : v;
    if constexpr (kOp == EwOp::AddScalar) return add_rn(v, s);
    if constexpr (kOp == EwOp::MulScalar) return mul_rn(v, s);
  }
};

template <typename A>
struct ClampF {
  float lo, hi;
  __device__ A operator()(A x) const {
    const A l = static_cast<A>(lo), h = static_cast<A>(hi);
    return x < l ? l : (x > h ? h : x);
  }
};

struct NotF {
  template <typename A>
  __device__ bool operator()(A x) const {
    return !static_cast<bool>(x);
  }
};

template <typename T>
bool unary_t(EwOp op, const EwArgs& a, double s0, double s1, cudaStream_t st) {
  using A = acc<T>;
  if (op == EwOp::LogicalNot) {
    launch<NotF, bool, T>(a, NotF{}, st);
    return true;
  }
  if constexpr (!std::is_same_v<T, bool>) {
    switch (op) {
#define TD_EW_NUM(OP, S)                           \
  case EwOp::OP:                                   \
    launch<NumF<EwOp::OP, A>, T, T>(a, {(S)}, st); \
    return true;
      TD_EW_NUM(Neg, A{})
      TD_EW_NUM(Abs, A{})
      TD_EW_NUM(AddScalar, static_cast<A>(s0))
      TD_EW_NUM(MulScalar, static_cast<A>(s0))
#undef TD_EW_NUM
      case EwOp::Clamp:
        launch<ClampF<A>, T, T>(a, {static_cast<float>(s0), static_cast<float>(s1)}, st);
        return true;
      default:
        break;
    }
  }
  if constexpr (std::is_same_v<A, float>) {
    switch (op) {
#define TD_EW_MATH(OP)                        \
  case EwOp::OP:                              \
    launch<MathF<EwOp::OP>, T, T>(a, {}, st); \
    return true;
      TD_EW_MATH(Exp)
      TD_EW_MATH(Log)
      TD_EW_MATH(Tanh)
      TD_EW_MATH(Sqrt)
      TD_EW_MATH(Rsqrt)
      TD_EW_MATH(Sigmoid)
      TD_EW_MATH(Sin)
      TD_EW_MATH(Cos)
      TD_EW_MATH(Square)
#undef TD_EW_MATH
#define TD_EW_PARAM(OP)                                              \
  case EwOp::OP:                                                     \
    launch<ParamF<EwOp::OP>, T, T>(a, {static_cast<float>(s0)}, st); \
    return true;
      TD_EW_PARAM(DivScalar)
      TD_EW_PARAM(RdivScalar)
      TD_EW_PARAM(PowScalar)
      TD_EW_PARAM(RpowScalar)
#undef TD_EW_PARAM
      default:
        break;
    }
  }
  return false;
}

}  // namespace
}  // namespace ew

bool ew_unary(EwOp op, const EwArgs& a, EwType t, double s0, double s1, cudaStream_t stream) {
  bool ok = false;
  ew::dispatch_all(t, [&]<typename T>() { ok = ew::unary_t<T>(op, a, s0, s1, stream); });
  return ok;
}

}  // namespace td::kernels
