#pragma once
// The CUDA elementwise engine: host launchers for everything that maps elements of strided,
// broadcast tensors (copy/cast, fill, unary/binary/scalar/comparison ops, where, masked_fill,
// tril/triu). No device code here; the machinery is in loops.cuh, the ops in functors.cuh.
//
// Note [Elementwise geometry]: the caller (src/ops/cuda/elementwise.cpp) broadcasts every input
// to the output's shape (stride 0), drops size-1 dims and merges neighbouring dims that are
// contiguous for every operand, exactly like the CPU loops (src/ops/cpu/loops.h), and hands over
// at most kEwMaxDims dims, innermost first, with strides in elements. Operand 0 is the output.
// When every operand is contiguous (one dim of stride 1) and aligned, the kernels use 16-byte
// vector loads and stores; otherwise each thread turns its flat index into per-operand offsets.
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels {

inline constexpr int kEwMaxDims = 12;
inline constexpr int kEwMaxOperands = 4;

// The element types, in td::DType's order.
enum class EwType : uint8_t { F32, BF16, F16, I32, I64, Bool };

struct EwArgs {
  int nops = 0;
  int ndim = 0;
  int64_t numel = 0;
  int64_t sizes[kEwMaxDims] = {};                    // innermost first
  int64_t strides[kEwMaxOperands][kEwMaxDims] = {};  // in elements; operand 0 is the output
  void* data[kEwMaxOperands] = {};
};

// Note [Elementwise op codes]: the same list, in the same order, as td::ops::Ew
// (src/ops/elementwise_impl.h), which names the op at the front-end; the glue casts between them.
// Each op mirrors the CPU lambda of src/ops/elementwise.cpp (same formula, same order of
// operations). fp32 products and sums are rounded one at a time, never fused into FMAs (g++ may
// fuse x + a*y on the CPU, so such formulas can differ by an ulp; everything else is bitwise).
enum class EwOp : uint8_t {
  // one input of dtype t -> t
  Neg,
  Abs,
  Exp,
  Log,
  Tanh,
  Sqrt,
  Rsqrt,
  Sigmoid,
  Sin,
  Cos,
  AddScalar,   // x + s0 (s0 converted to the compute type)
  MulScalar,   // x * s0
  DivScalar,   // x / float(s0)
  RdivScalar,  // float(s0) / x
  Square,      // x * x
  PowScalar,   // pow(x, float(s0))
  RpowScalar,  // pow(float(s0), x)
  Clamp,       // clamp(x, float(s0), float(s1))
  LogicalNot,  // any dtype -> bool
  // two inputs of dtype t -> t
  Add,
  AddAlpha,    // x + float(s0) * y, in fp32
  AddInplace,  // x + T(float(s0)) * y
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  PowLogBackward,   // x == 0 ? 0 : log(x)
  MaxBackward,      // x == y ? 0.5 : (x > y)
  MinBackward,      // x == y ? 0.5 : (x < y)
  ClampBackward,    // (g, x): s0 <= x <= s1 ? g : 0
  TanhBackward,     // (g, y): g * (1 - y*y)
  SqrtBackward,     // (g, y): g / (2*y)
  RsqrtBackward,    // (g, y): -0.5 * g * y * y * y
  SigmoidBackward,  // (g, y): g * y * (1 - y)
  SinBackward,      // (g, x): g * cos(x)
  CosBackward,      // (g, x): -g * sin(x)
  AbsBackward,      // (g, x): x > 0 ? g : (x < 0 ? -g : 0)
  // two inputs of dtype t -> bool
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  kCount
};

// dst <- src converted (operands: dst, src), as the CPU's static_cast through the compute types.
void ew_cast(const EwArgs& a, EwType dst, EwType src, cudaStream_t stream);
// The element types of a conversion: EwType's, then the FP8 formats (td::DType's order).
enum class CastType : uint8_t { F32, BF16, F16, I32, I64, Bool, F8E4M3FN, F8E5M2 };
// dst <- src converted (operands: dst, src) where dst, src or both are FP8: through float, FP8
// values rounded to nearest even as the CPU rounds them (Note [FP8 kernel conversions] in
// common/fp8.cuh); overflow gives +-max when saturate, else NaN (E4M3FN) / +-inf (E5M2). Between
// equal FP8 types the bytes are copied.
void ew_cast_fp8(const EwArgs& a, CastType dst, CastType src, bool saturate, cudaStream_t stream);
// dst (E4M3FN / E5M2) <- fp8(float(src) * scale), saturating (operands: dst, src; src float32,
// bfloat16 or float16): FP8 quantization in one pass, the product rounded to float as the CPU's
// fp8_quantize forms it (td::mul of the fp32 tensor by the scale), then encoded as ew_cast_fp8.
void ew_scale_cast_fp8(const EwArgs& a, CastType dst, CastType src, float scale,
                       cudaStream_t stream);
// Every element of operand 0 set to the `elem_bytes`-byte pattern `bits`.
void ew_fill(const EwArgs& a, int elem_bytes, uint64_t bits, cudaStream_t stream);
// Unary (Neg .. LogicalNot) or binary (Add .. Ge) op on inputs of dtype t. False (nothing
// launched) when the op is not defined for t (e.g. Exp on int32); the glue reports it.
bool ew_unary(EwOp op, const EwArgs& a, EwType t, double s0, double s1, cudaStream_t stream);
bool ew_binary(EwOp op, const EwArgs& a, EwType t, double s0, double s1, cudaStream_t stream);
// out = mask ? value : x (operands: out, x, mask (bool)).
void ew_masked_fill(const EwArgs& a, EwType t, double value, cudaStream_t stream);
// out = cond ? x : y (operands: out, cond (bool), x, y).
void ew_where(const EwArgs& a, EwType t, cudaStream_t stream);
// Contiguous [rows / R, R, C] matrices: out[r, j] = keep ? in[r, j] : 0 where, with i = r % R,
// keep = (j - i >= k) for upper (triu), (j - i <= k) otherwise (tril).
void ew_triangle(void* out, const void* in, int64_t rows, int64_t R, int64_t C, int elem_bytes,
                 bool upper, int64_t k, cudaStream_t stream);

}  // namespace td::kernels
