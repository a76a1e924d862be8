#if TD_WITH_CUDA
#include "ops/cuda/elementwise.h"

#include <vector>

#include "ops/cuda/ew_args.h"
#include "ops/cuda/launch.h"

namespace td::cuda_ops {

static_assert(static_cast<int>(ops::Ew::kCount) == static_cast<int>(kernels::EwOp::kCount) &&
                  static_cast<int>(ops::Ew::LogicalNot) ==
                      static_cast<int>(kernels::EwOp::LogicalNot) &&
                  static_cast<int>(ops::Ew::Add) == static_cast<int>(kernels::EwOp::Add) &&
                  static_cast<int>(ops::Ew::AbsBackward) ==
                      static_cast<int>(kernels::EwOp::AbsBackward) &&
                  static_cast<int>(ops::Ew::Ge) == static_cast<int>(kernels::EwOp::Ge),
              "ops::Ew and kernels::EwOp must list the same ops in the same order");

kernels::EwType ew_type(DType t) {
  switch (t) {
    case DType::Float32:
      return kernels::EwType::F32;
    case DType::BFloat16:
      return kernels::EwType::BF16;
    case DType::Float16:
      return kernels::EwType::F16;
    case DType::Int32:
      return kernels::EwType::I32;
    case DType::Int64:
      return kernels::EwType::I64;
    case DType::Bool:
      return kernels::EwType::Bool;
    case DType::Float8E4M3FN:
    case DType::Float8E5M2:
      break;  // Note [FP8 dtypes]: copy_ converts them through kernels::ew_cast_fp8
  }
  TD_ERROR("elementwise: unsupported dtype ", dtype_name(t),
           " (float8 tensors only convert and move on CUDA: use .to() first)");
}

kernels::EwArgs make_ew_args(const char* op, std::initializer_list<const Tensor*> operands) {
  const int n = static_cast<int>(operands.size());
  TD_CHECK(n >= 1 && n <= kernels::kEwMaxOperands, op, ": elementwise op with ", n, " operands");
  const Tensor& out = **operands.begin();
  const Shape& shape = out.sizes();
  std::vector<Shape> st;
  kernels::EwArgs a;
  a.nops = n;
  for (const Tensor* t : operands) {
    st.push_back(t == &out ? t->strides() : broadcast_strides(t->sizes(), t->strides(), shape));
    a.data[st.size() - 1] = t->data_ptr();
  }
  a.numel = numel_of(shape);
  // Coalesce, outermost first (as cpu::make_geometry), into these lists.
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides(n);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!sizes.empty()) {
      bool mergeable = true;
      for (int k = 0; k < n; ++k) {
        if (strides[k].back() != st[k][d] * shape[d]) mergeable = false;
      }
      if (mergeable) {
        sizes.back() *= shape[d];
        for (int k = 0; k < n; ++k) strides[k].back() = st[k][d];
        continue;
      }
    }
    sizes.push_back(shape[d]);
    for (int k = 0; k < n; ++k) strides[k].push_back(st[k][d]);
  }
  if (sizes.empty()) {  // a single element
    sizes.push_back(1);
    for (int k = 0; k < n; ++k) strides[k].push_back(0);
  }
  const int nd = static_cast<int>(sizes.size());
  TD_CHECK(nd <= kernels::kEwMaxDims, op, ": the CUDA elementwise kernels take at most ",
           kernels::kEwMaxDims, " dims after merging contiguous ones; got ", nd, " for ",
           shape_str(shape), " (make the operands contiguous first)");
  a.ndim = nd;
  for (int d = 0; d < nd; ++d) {  // innermost first
    a.sizes[d] = sizes[nd - 1 - d];
    for (int k = 0; k < n; ++k) a.strides[k][d] = strides[k][nd - 1 - d];
  }
  return a;
}

void ew_unary(const char* opname, const ops::EwSpec& spec, const Tensor& out, const Tensor& a) {
  check_same_cuda_device(opname, out, {&a});
  if (out.numel() == 0) return;
  OnDevice on(out);
  kernels::EwArgs args = make_ew_args(opname, {&out, &a});
  bool ok = kernels::ew_unary(static_cast<kernels::EwOp>(spec.op), args, ew_type(a.dtype()),
                              spec.s0, spec.s1, stream_of(out));
  TD_CHECK(ok, opname, ": no CUDA kernel for dtype ", dtype_name(a.dtype()));
}

void ew_binary(const char* opname, const ops::EwSpec& spec, const Tensor& out, const Tensor& a,
               const Tensor& b) {
  check_same_cuda_device(opname, out, {&a, &b});
  ops::check_same_dtype(a, b, opname);
  if (out.numel() == 0) return;
  OnDevice on(out);
  kernels::EwArgs args = make_ew_args(opname, {&out, &a, &b});
  bool ok = kernels::ew_binary(static_cast<kernels::EwOp>(spec.op), args, ew_type(a.dtype()),
                               spec.s0, spec.s1, stream_of(out));
  TD_CHECK(ok, opname, ": no CUDA kernel for dtype ", dtype_name(a.dtype()));
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
