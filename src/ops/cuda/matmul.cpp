// CUDA side of matmul / mm / bmm / linear: tensors to kernels/gemm (cuBLASLt).
#if TD_WITH_CUDA

#include "ops/cuda/matmul.h"

#include <algorithm>
#include <vector>

#include "gemm/gemm.cuh"
#include "ops/cuda/launch.h"
#include "tardelli/ops/matmul.h"

namespace td::cuda_ops {
namespace {

kernels::GemmType gemm_type(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::Float32:
      return kernels::GemmType::kFloat32;
    case DType::BFloat16:
      return kernels::GemmType::kBFloat16;
    case DType::Float16:
      return kernels::GemmType::kFloat16;
    default:
      break;
  }
  TD_ERROR(op, ": no CUDA matrix product for ", describe(t));
}

// How a [rows, cols] matrix with strides (s0, s1) reaches the GEMM: row-major (trans = false,
// ld = the row stride), or column-major, which is the transpose of a row-major [cols, rows]
// (trans = true, ld = the column stride). The stride of a dim of size 1 does not matter. Not ok
// for any other layout (both strides > 1, overlapping or zero-stride rows): copy first.
struct MatLayout {
  bool ok = false;
  bool trans = false;
  int64_t ld = 0;
};

MatLayout layout_of(int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  const int64_t r1 = std::max<int64_t>(rows, 1), c1 = std::max<int64_t>(cols, 1);
  if ((cols <= 1 || s1 == 1) && (rows <= 1 || s0 >= c1)) {
    return {true, false, rows <= 1 ? c1 : s0};
  }
  if ((rows <= 1 || s0 == 1) && (cols <= 1 || s1 >= r1)) {
    return {true, true, cols <= 1 ? r1 : s1};
  }
  return {};
}

// The inner matrix of t ([..., rows, cols]) as the GEMM sees it; t becomes a contiguous copy
// when its layout is not one of the two above.
MatLayout inner_layout(Tensor& t, int64_t rows, int64_t cols) {
  const int64_t nd = t.dim();
  MatLayout l = layout_of(rows, cols, t.stride(nd - 2), t.stride(nd - 1));
  if (!l.ok) {
    t = t.contiguous();
    l = layout_of(rows, cols, t.stride(nd - 2), t.stride(nd - 1));
  }
  return l;
}

// t itself when it is packed (contiguous) at a 16-byte aligned address, else such a copy: what
// cuBLASLt's epilogue vectors and FP8 operands need.
Tensor packed_aligned(const Tensor& t) {
  const bool aligned = t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  if (aligned) return t;
  Tensor fresh = Tensor::empty(t.sizes(), t.dtype(), t.device());
  fresh.copy_(t);
  return fresh;
}

// One batch dim of the output with the element strides of a, b and out along it (0 where an
// operand is broadcast).
struct BatchDim {
  int64_t size, sa, sb, sc;
};

}  // namespace

void matmul_out(const Tensor& a_in, const Tensor& b_in, const Tensor& bias_in, const Tensor& out,
                const char* op) {
  check_same_cuda_device(op, out, {&a_in, &b_in, &bias_in});
  const int64_t nd = out.dim();
  TD_CHECK(nd >= 2 && a_in.dim() == nd && b_in.dim() == nd && a_in.dtype() == out.dtype() &&
               b_in.dtype() == out.dtype(),
           op, ": internal: CUDA matmul of ", describe(a_in), " and ", describe(b_in), " into ",
           describe(out));
  const int64_t M = out.size(nd - 2), N = out.size(nd - 1), K = a_in.size(nd - 1);
  TD_CHECK(a_in.size(nd - 2) == M && b_in.size(nd - 2) == K && b_in.size(nd - 1) == N, op,
           ": internal: shapes ", shape_str(a_in.sizes()), " and ", shape_str(b_in.sizes()),
           " do not give ", shape_str(out.sizes()));
  if (out.numel() == 0) return;
  const kernels::GemmType type = gemm_type(out, op);
  OnDevice on_device(out);

  Tensor a = a_in, b = b_in;
  MatLayout la, lb;
  if (K == 0) {  // nothing is read from a or b: any valid leading dims
    la = {true, false, 1};
    lb = {true, false, std::max<int64_t>(N, 1)};
  } else {
    la = inner_layout(a, M, K);
    lb = inner_layout(b, K, N);
  }
  const MatLayout lc = layout_of(M, N, out.stride(nd - 2), out.stride(nd - 1));
  TD_CHECK(lc.ok && !lc.trans, op, ": internal: output ", shape_str(out.sizes()), " strides ",
           shape_str(out.strides()), " is not row-major");

  Tensor bias;
  if (bias_in.defined()) {
    TD_CHECK(bias_in.dim() == 1 && bias_in.size(0) == N && bias_in.dtype() == out.dtype(), op,
             ": internal: bias ", describe(bias_in), " for ", N, " output features");
    bias = packed_aligned(bias_in.detach());  // the epilogue reads a packed, aligned vector
  }

  std::vector<BatchDim> dims;
  for (int64_t i = 0; i < nd - 2; ++i) {
    const int64_t s = out.size(i);
    TD_CHECK((a.size(i) == s || a.size(i) == 1) && (b.size(i) == s || b.size(i) == 1), op,
             ": internal: batch dims of ", shape_str(a.sizes()), " and ", shape_str(b.sizes()),
             " do not broadcast to ", shape_str(out.sizes()));
    if (s == 1) continue;
    dims.push_back(
        {s, a.size(i) == 1 ? 0 : a.stride(i), b.size(i) == 1 ? 0 : b.stride(i), out.stride(i)});
  }
  // Adjacent dims that are one strided run in all three tensors become one dim.
  std::vector<BatchDim> merged;
  for (const BatchDim& d : dims) {
    if (!merged.empty()) {
      BatchDim& o = merged.back();
      if (o.sa == d.sa * d.size && o.sb == d.sb * d.size && o.sc == d.sc * d.size) {
        o = {o.size * d.size, d.sa, d.sb, d.sc};
        continue;
      }
    }
    merged.push_back(d);
  }

  kernels::GemmArgs g;
  g.dtype = type;
  g.m = M;
  g.n = N;
  g.k = K;
  g.lda = la.ld;
  g.trans_a = la.trans;
  g.ldb = lb.ld;
  g.trans_b = lb.trans;
  g.ldc = lc.ld;
  g.allow_tf32 = matmul_allow_tf32();
  g.bias = bias.defined() ? bias.data_ptr() : nullptr;
  g.stream = stream_of(out);

  // A matrix b shared by the whole batch, with a's and out's rows one strided run: a single
  // GEMM with batch*M rows (the shape cuBLASLt runs fastest).
  if (merged.size() == 1 && merged[0].sb == 0 && !la.trans && merged[0].sa == M * la.ld &&
      merged[0].sc == M * lc.ld) {
    g.m = M * merged[0].size;
    merged.clear();
  }
  // The innermost remaining dim is cuBLASLt's strided batch unless an operand is broadcast
  // along it (stride 0): the outer dims, and such a dim, are a loop of calls.
  if (!merged.empty() && merged.back().sa != 0 && merged.back().sb != 0) {
    g.batch = merged.back().size;
    g.stride_a = merged.back().sa;
    g.stride_b = merged.back().sb;
    g.stride_c = merged.back().sc;
    merged.pop_back();
  }

  const size_t ws_bytes = kernels::gemm_workspace_bytes();
  Tensor workspace = scratch_bytes(out, ws_bytes);  // freed stream-ordered after the calls
  g.workspace = workspace.data_ptr();
  g.workspace_bytes = ws_bytes;

  const int64_t es = static_cast<int64_t>(out.element_size());
  const char* base_a = static_cast<const char*>(a.data_ptr());
  const char* base_b = static_cast<const char*>(b.data_ptr());
  char* base_c = static_cast<char*>(out.data_ptr());
  int64_t outer = 1;
  for (const BatchDim& d : merged) outer *= d.size;
  for (int64_t idx = 0; idx < outer; ++idx) {
    int64_t rem = idx, oa = 0, ob = 0, oc = 0;
    for (size_t j = merged.size(); j-- > 0;) {
      const int64_t i = rem % merged[j].size;
      rem /= merged[j].size;
      oa += i * merged[j].sa;
      ob += i * merged[j].sb;
      oc += i * merged[j].sc;
    }
    g.a = base_a + oa * es;
    g.b = base_b + ob * es;
    g.c = base_c + oc * es;
    kernels::gemm(g);
  }
}

namespace {

kernels::Fp8Type fp8_type(const Tensor& t) {
  return t.dtype() == DType::Float8E5M2 ? kernels::Fp8Type::kE5M2 : kernels::Fp8Type::kE4M3;
}

}  // namespace

bool fp8_mm_supported(const Tensor& a, const Tensor& b, DType out_dtype) {
  if (!a.is_cuda() || !b.is_cuda() || a.device() != b.device() || a.dim() != 2 || b.dim() != 2) {
    return false;
  }
  if (!is_float8(a.dtype()) || !is_float8(b.dtype()) ||
      (a.dtype() == DType::Float8E5M2 && b.dtype() == DType::Float8E5M2) ||
      !is_floating(out_dtype)) {
    return false;
  }
  const int64_t k = a.size(1), n = b.size(0);
  if (b.size(1) != k || k % 16 != 0 || n % 16 != 0) return false;
  OnDevice on_device(a);
  return kernels::gemm_fp8_supported_device();
}

void fp8_mm_out(const Tensor& a_in, const Tensor& b_in, float alpha, const Tensor& bias_in,
                const Tensor& out) {
  check_same_cuda_device("fp8_mm", out, {&a_in, &b_in, &bias_in});
  // What cuBLASLt cannot take (fp8_mm_supported's conditions) kernels::gemm_fp8 refuses itself.
  TD_CHECK(is_float8(a_in.dtype()) && is_float8(b_in.dtype()) && a_in.dim() == 2 &&
               b_in.dim() == 2 && out.is_contiguous() && out.dim() == 2 &&
               out.size(0) == a_in.size(0) && out.size(1) == b_in.size(0),
           "fp8_mm: internal: no FP8 GEMM of ", describe(a_in), " and ", describe(b_in), " into ",
           describe(out));
  if (out.numel() == 0) return;
  OnDevice on_device(out);
  const Tensor a = packed_aligned(a_in), b = packed_aligned(b_in);
  Tensor bias;
  if (bias_in.defined()) {
    TD_CHECK(bias_in.dim() == 1 && bias_in.size(0) == out.size(1) &&
                 bias_in.dtype() == out.dtype() && out.dtype() != DType::Float32,
             "fp8_mm: internal: bias ", describe(bias_in), " for ", describe(out));
    bias = packed_aligned(bias_in.detach());
  }
  kernels::Fp8GemmArgs g;
  g.m = a.size(0);
  g.n = b.size(0);
  g.k = a.size(1);
  g.a = a.data_ptr();
  g.lda = g.k;
  g.a_type = fp8_type(a);
  g.b = b.data_ptr();
  g.ldb = g.k;
  g.b_type = fp8_type(b);
  g.c = out.data_ptr();
  g.ldc = g.n;
  g.c_type = gemm_type(out, "fp8_mm");
  g.alpha = alpha;
  g.bias = bias.defined() ? bias.data_ptr() : nullptr;
  g.stream = stream_of(out);
  const size_t ws_bytes = kernels::gemm_workspace_bytes();
  Tensor workspace = scratch_bytes(out, ws_bytes);
  g.workspace = workspace.data_ptr();
  g.workspace_bytes = ws_bytes;
  kernels::gemm_fp8(g);
}

}  // namespace td::cuda_ops

#endif  // TD_WITH_CUDA
