// Two-input ops of the elementwise engine: arithmetic (inputs already promoted to one dtype by
// the front-end), the gradient formulas of src/ops/elementwise.cpp, and comparisons.
#include "elementwise/elementwise.cuh"
#include "elementwise/loops.cuh"

namespace td::kernels {

namespace ew {
namespace {

// Arithmetic valid for every numeric compute type A (float or an integer type).
template <EwOp kOp>
struct ArithF {
  template <typename A>
  __device__ A operator()(A x, A y) const {
    if constexpr (kOp == EwOp::Add) return add_rn(x, y);
    if constexpr (kOp == EwOp::Mul) return mul_rn(x, y);
    if constexpr (kOp == EwOp::Maximum) return x >= y ? x : y;
    if constexpr (kOp == EwOp::Minimum) return x <= y ? x : y;
  }
};

// x + alpha * y computed in fp32 whatever the dtype (the CPU's `x + fa * y` with float fa).
struct AddAlphaF {
  float alpha;
  template <typename A>
  __device__ float operator()(A x, A y) const {
    return add_rn(static_cast<float>(x), mul_rn(alpha, static_cast<float>(y)));
  }
};

// x + A(alpha) * y (add_: alpha converted to the compute type first).
template <typename A>
struct AddInplaceF {
  A alpha;
  __device__ A operator()(A x, A y) const { return add_rn(x, mul_rn(alpha, y)); }
};

// Floating-only formulas (float compute type).
template <EwOp kOp>
struct FloatF {
  float lo, hi;  // ClampBackward's bounds
  __device__ float operator()(float x, float y) const {
    if constexpr (kOp == EwOp::Div) return x / y;
    if constexpr (kOp == EwOp::Pow) return powf(x, y);
    if constexpr (kOp == EwOp::PowLogBackward) return x == 0.0f ? 0.0f : logf(x);
    if constexpr (kOp == EwOp::MaxBackward) return x == y ? 0.5f : (x > y ? 1.0f : 0.0f);
    if constexpr (kOp == EwOp::MinBackward) return x == y ? 0.5f : (x < y ? 1.0f : 0.0f);
    if constexpr (kOp == EwOp::ClampBackward) return (y >= lo && y <= hi) ? x : 0.0f;
    if constexpr (kOp == EwOp::TanhBackward) return mul_rn(x, sub_rn(1.0f, mul_rn(y, y)));
    if constexpr (kOp == EwOp::SqrtBackward) return x / mul_rn(2.0f, y);
    if constexpr (kOp == EwOp::RsqrtBackward) {
      return mul_rn(mul_rn(mul_rn(mul_rn(-0.5f, x), y), y), y);
    }
    if constexpr (kOp == EwOp::SigmoidBackward) return mul_rn(mul_rn(x, y), sub_rn(1.0f, y));
    if constexpr (kOp == EwOp::SinBackward) return mul_rn(x, cosf(y));
    if constexpr (kOp == EwOp::CosBackward) return mul_rn(-x, sinf(y));
    if constexpr (kOp == EwOp::AbsBackward) return y > 0.0f ? x : (y < 0.0f ? -x : 0.0f);
  }
};

template <EwOp kOp>
struct CompareF {
  template <typename A>
  __device__ bool operator()(A x, A y) const {
    if constexpr (kOp == EwOp::Eq) return x == y;
    if constexpr (kOp == EwOp::Ne) return x != y;
    if constexpr (kOp == EwOp::Lt) return x < y;
    if constexpr (kOp == EwOp::Le) return x <= y;
    if constexpr (kOp == EwOp::Gt) return x > y;
    if constexpr (kOp == EwOp::Ge) return x >= y;
  }
};

template <typename T>
bool binary_t(EwOp op, const EwArgs& a, double s0, double s1, cudaStream_t st) {
  using A = acc<T>;
  switch (op) {
#define TD_EW_CMP(OP)                                  \
  case EwOp::OP:                                       \
    launch<CompareF<EwOp::OP>, bool, T, T>(a, {}, st); \
    return true;
    TD_EW_CMP(Eq)
    TD_EW_CMP(Ne)
    TD_EW_CMP(Lt)
    TD_EW_CMP(Le)
    TD_EW_CMP(Gt)
    TD_EW_CMP(Ge)
#undef TD_EW_CMP
    default:
      break;
  }
  if constexpr (!std::is_same_v<T, bool>) {
    switch (op) {
#define TD_EW_ARITH(OP)                           \
  case EwOp::OP:                                  \
    launch<ArithF<EwOp::OP>, T, T, T>(a, {}, st); \
    return true;
      TD_EW_ARITH(Add)
      TD_EW_ARITH(Mul)
      TD_EW_ARITH(Maximum)
      TD_EW_ARITH(Minimum)
#undef TD_EW_ARITH
      case EwOp::AddAlpha:
        launch<AddAlphaF, T, T, T>(a, {static_cast<float>(s0)}, st);
        return true;
      case EwOp::AddInplace:
        launch<AddInplaceF<A>, T, T, T>(a, {static_cast<A>(static_cast<float>(s0))}, st);
        return true;
      default:
        break;
    }
  }
  if constexpr (std::is_same_v<A, float>) {
    switch (op) {
#define TD_EW_FLOAT(OP)                                                                         \
  case EwOp::OP:                                                                                \
    launch<FloatF<EwOp::OP>, T, T, T>(a, {static_cast<float>(s0), static_cast<float>(s1)}, st); \
    return true;
      TD_EW_FLOAT(Div)
      TD_EW_FLOAT(Pow)
      TD_EW_FLOAT(PowLogBackward)
      TD_EW_FLOAT(MaxBackward)
      TD_EW_FLOAT(MinBackward)
      TD_EW_FLOAT(ClampBackward)
      TD_EW_FLOAT(TanhBackward)
      TD_EW_FLOAT(SqrtBackward)
      TD_EW_FLOAT(RsqrtBackward)
      TD_EW_FLOAT(SigmoidBackward)
      TD_EW_FLOAT(SinBackward)
      TD_EW_FLOAT(CosBackward)
      TD_EW_FLOAT(AbsBackward)
#undef TD_EW_FLOAT
      default:
        break;
    }
  }
  return false;
}

}  // namespace
}  // namespace ew

bool ew_binary(EwOp op, const EwArgs& a, EwType t, double s0, double s1, cudaStream_t stream) {
  bool ok = false;
  ew::dispatch_all(t, [&]<typename T>() { ok = ew::binary_t<T>(op, a, s0, s1, stream); });
  return ok;
}

}  // namespace td::kernels
