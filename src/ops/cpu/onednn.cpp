#include "ops/cpu/onednn.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "ops/cpu/loops.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/view.h"

namespace td::cpu {

namespace {

using dnnl::memory;

memory::data_type to_dnnl(DType t) {
  switch (t) {
    case DType::Float32:
      return memory::data_type::f32;
    case DType::BFloat16:
      return memory::data_type::bf16;
    case DType::Float16:
      return memory::data_type::f16;
    default:
      TD_ERROR("matmul: oneDNN has no matmul for dtype ", dtype_name(t));
  }
}

std::atomic<int64_t> g_created{0};

// Note [Matmul primitive cache]: creating a oneDNN primitive (descriptor, JIT kernel) costs far
// more than a small GEMM, and a training step issues the same few shapes every iteration. A
// process-wide LRU keyed by everything that shapes the primitive (dims, strides, dtype, bias)
// makes every step after the first reuse them. A primitive is executable from several threads
// at once, so entries are shared_ptrs handed out under the lock and run outside it.
//
// Note [Matmul scratchpad]: that holds only with a user-managed scratchpad. By default oneDNN
// (built for OpenMP without DNNL_ENABLE_CONCURRENT_EXEC, as Debian's is) gives a primitive the
// global scratchpad of the thread that created it, so two threads running one cached
// primitive at once share its scratch memory: wrong results now and then (seen as a GEMM off by
// 5.8 of 32 in tests/python/test_tensor_api.py's concurrent-threads test under load). Every
// primitive is created with scratchpad_mode::user and each execution passes the calling
// thread's buffer (thread_scratch): per thread like oneDNN's own, outside the tensor allocator
// and its statistics as oneDNN's was, grown to the largest scratchpad the thread has needed.
struct Entry {
  std::shared_ptr<dnnl::matmul> prim;  // null: oneDNN only had its reference implementation
  memory::desc scratch;                // the execution's scratchpad (size 0: none)
  // Note [Operand layouts for sgemm]: operands to copy into the other inner layout first, or
  // into the same layout with a padded leading dimension (the new one; 0: not padded).
  bool repack_a = false;  // a column-major: copy it row-major
  bool repack_b = false;  // b row-major: copy it column-major
  int64_t pad_a = 0, pad_b = 0;
};

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    return h;
  }
};

class PrimitiveCache {
 public:
  static constexpr size_t kCapacity = 512;

  std::optional<Entry> find(const Key& k) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(k);
    if (it == map_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second.second);
    return it->second.first;
  }

  void insert(const Key& k, Entry e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.count(k)) return;
    order_.push_front(k);
    map_.emplace(k, std::make_pair(std::move(e), order_.begin()));
    if (map_.size() > kCapacity) {
      map_.erase(order_.back());
      order_.pop_back();
    }
  }

 private:
  std::mutex mu_;
  std::list<Key> order_;  // most recent first
  std::unordered_map<Key, std::pair<Entry, std::list<Key>::iterator>, KeyHash> map_;
};

PrimitiveCache& cache() {
  static PrimitiveCache c;
  return c;
}

// The layout of one operand as oneDNN will see it.
struct Operand {
  memory::dims dims, strides;
};

// Whether the operand's inner matrix is stored row-major (unit stride along its columns).
bool row_major(const Operand& op) {
  const size_t nd = op.dims.size();
  return op.strides[nd - 1] == 1 && op.strides[nd - 2] != 1;
}

// The stride of the inner matrix's non-unit-stride dim.
int64_t leading_dim(const Operand& op) {
  const size_t nd = op.dims.size();
  return row_major(op) ? op.strides[nd - 2] : op.strides[nd - 1];
}

// Rewrites the strides of a [batch..., R, C] operand into a form oneDNN's GEMM accepts: batch
// dims that are broadcast (size 1 or stride 0) become size 1, and size-1 dims get strides that
// make the inner matrix plainly row- or column-major. Returns false when the inner matrix has
// no unit stride (e.g. a slice with step 2 in both dims): the caller copies it.
bool describe_operand(const Tensor& t, Operand& op) {
  const int64_t nd = t.dim();
  op.dims.assign(t.sizes().begin(), t.sizes().end());
  op.strides.assign(t.strides().begin(), t.strides().end());
  int64_t R = op.dims[nd - 2], C = op.dims[nd - 1];
  int64_t& sr = op.strides[nd - 2];
  int64_t& sc = op.strides[nd - 1];
  if (R == 1 && C == 1) {
    sr = sc = 1;
  } else if (R == 1) {
    if (sc == 1)
      sr = C;
    else
      sr = 1;
  } else if (C == 1) {
    if (sr == 1)
      sc = R;
    else
      sc = 1;
  }
  bool ok = (sc == 1 && sr >= C) || (sr == 1 && sc >= R);
  if (!ok) return false;
  // Extent of the inner matrix in elements; batch dims of size 1 get a stride past it.
  int64_t extent = std::max(sr * R, sc * C);
  for (int64_t d = nd - 3; d >= 0; --d) {
    if (op.dims[d] == 1 || op.strides[d] == 0) {
      op.dims[d] = 1;
      op.strides[d] = extent;
    } else {
      extent = std::max(extent, op.strides[d] * op.dims[d]);
    }
  }
  return true;
}

void append(Key& k, const Operand& op) {
  k.insert(k.end(), op.dims.begin(), op.dims.end());
  k.insert(k.end(), op.strides.begin(), op.strides.end());
}

memory::desc dense_md(const memory::dims& dims, memory::data_type dt) {
  memory::dims st(dims.size());
  int64_t s = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    st[i] = s;
    s *= std::max<int64_t>(dims[i], 1);
  }
  return memory::desc(dims, dt, st);
}

// The bias as a [1, ..., 1, N] tensor broadcast over rows and batch.
memory::desc bias_md(const memory::dims& out_dims, memory::data_type dt) {
  memory::dims bd(out_dims.size(), 1);
  bd.back() = out_dims.back();
  return dense_md(bd, dt);
}

// The calling thread's scratchpad of at least `bytes` (Note [Matmul scratchpad]), 64-byte
// aligned.
void* thread_scratch(size_t bytes) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<void, Free> buf;
  thread_local size_t cap = 0;
  if (bytes > cap) {
    cap = (bytes + 4095) / 4096 * 4096;
    buf.reset(std::aligned_alloc(64, cap));
    TD_CHECK(buf != nullptr, "matmul: could not allocate a ", cap, "-byte oneDNN scratchpad");
  }
  return buf.get();
}

// A contiguous copy that is not recorded by autograd.
Tensor dense(const Tensor& t) {
  Tensor c = Tensor::empty(t.sizes(), t.dtype(), t.device());
  copy_into(c, t);
  return c;
}

dnnl::matmul::primitive_desc describe_matmul(const Operand& a, const Operand& b, bool has_bias,
                                             const memory::dims& out_dims, memory::data_type dt) {
  memory::desc a_md(a.dims, dt, a.strides);
  memory::desc b_md(b.dims, dt, b.strides);
  memory::desc c_md = dense_md(out_dims, dt);
  dnnl::primitive_attr attr;  // Note [Matmul scratchpad]
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (has_bias) {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, bias_md(out_dims, dt), c_md),
                                        attr, onednn_engine());
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, onednn_engine());
}

// The operand with its inner matrix stored the other way (row-major <-> column-major).
Operand repacked(const Operand& op) {
  Operand r = op;
  const size_t nd = op.dims.size();
  const int64_t R = op.dims[nd - 2], C = op.dims[nd - 1];
  const bool rm = row_major(op);
  r.strides[nd - 2] = rm ? 1 : C;
  r.strides[nd - 1] = rm ? R : 1;
  for (size_t d = 0; d + 2 < nd; ++d) r.strides[d] = R * C;  // batch dims are all 1 here
  return r;
}

// The operand with its leading dimension (the stride of its non-unit-stride inner dim) set to
// ld, same orientation.
Operand padded(const Operand& op, int64_t ld) {
  Operand r = op;
  const size_t nd = op.dims.size();
  const int64_t R = op.dims[nd - 2], C = op.dims[nd - 1];
  const bool rm = row_major(op);
  (rm ? r.strides[nd - 2] : r.strides[nd - 1]) = ld;
  for (size_t d = 0; d + 2 < nd; ++d) r.strides[d] = ld * (rm ? R : C);  // batch dims 1
  return r;
}

// Note [Operand layouts for sgemm]: oneDNN 2.6's fp32 GEMM on AVX2 CPUs ("gemm:jit", no brgemm
// below AVX-512) is up to 2x slower for some operand layouts, and the weight gradient of every
// linear layer, dW = dY^T X, hits them: both operands are stored [tokens, features], so the
// contraction runs along the slow dim of both. Measured on the 2-core Zen 3 machine (2 threads,
// GFLOP/s, N = row-major, T = column-major, A then B):
//   M x K x N              NN    TN    NT
//   1024 x 2048 x 256     125    61   120     (c_fc's dW: A = dY^T is column-major)
//   8192 x 512 x 256      131    64   144     (a chunk of the LM head's dW)
//   768 x 2048 x 256      124   117   130     (c_attn's dW: TN is fine below M = 1024)
//   256 x 2048 x 1024      74    71   119     (mlp.c_proj's dW)
//   256 x 512 x 8192       73    53   104
// So a column-major A with M >= 1024 and a long contraction is copied row-major first, and a
// row-major B is copied column-major when M is small and K and N are long. The copies are
// blocked transposes (Note [Transposed copies], ~10-20 GB/s), a few percent of the product they
// speed up (each copied element feeds at least 128 multiply-adds). The rule applies only to
// that implementation and fp32, single matrices; other ISAs (brgemm) and dtypes keep their
// layouts.
// Note [Padded leading dimensions]: most of that slowdown is the leading dimension, not the
// layout. With a power-of-two leading dimension of 4 KiB or more (a model's 1024 or 8192
// features) the GEMM's strided panel reads fall into a few cache sets. Measured with dnnl_sgemm
// (GFLOP/s, 2 threads), TN with the model's leading dims / with 16 floats of padding / NN after a
// transpose: c_fc dW 1024 x 2048 x 256: 55 / 89 / 90; mlp.c_proj dW 256 x 2048 x 1024 (B
// row-major, ldb 1024): 49-94 / 101-115 / 107 (NT); and an NT product with ldb 1024 (mlp.c_proj
// forward) 100 -> 109. So a column-major A, or any B, whose leading dimension is such a power of
// two is copied into the same layout with the leading dimension + kLdPad: a row-by-row copy at
// memcpy speed instead of a transposition (~10-15 GB/s). For A only with a long contraction
// (K >= 1024): the LM head's dW chunk (8192 x 512 x 256, lda 8192) ran slower padded (25 vs
// 23 ms) than transposed. In td matmul, interleaved (ms, median of 21): c_fc dW 12.9 -> 11.8,
// mlp.c_proj dW 13.5 -> 10.5, mlp.c_proj forward 10.3 -> 9.8. The transposing repack stays for
// the other slow cases above.
constexpr int64_t kLdPad = 16;
constexpr int64_t kMinConflictLd = 1024;  // floats: 4 KiB

bool conflicting_ld(int64_t ld) {
  return ld >= kMinConflictLd && (ld & (ld - 1)) == 0;
}

void choose_repacking(Entry& e, const dnnl::matmul::primitive_desc& pd, const Operand& a,
                      const Operand& b, memory::data_type dt) {
  if (dt != memory::data_type::f32 || std::string(pd.impl_info_str()) != "gemm:jit") return;
  const size_t nd = a.dims.size();
  for (size_t d = 0; d + 2 < nd; ++d) {
    if (a.dims[d] != 1 || b.dims[d] != 1) return;
  }
  const int64_t M = a.dims[nd - 2], K = a.dims[nd - 1], N = b.dims[nd - 1];
  const bool a_col = a.strides[nd - 2] == 1 && a.strides[nd - 1] != 1 && M > 1;
  const bool b_row = b.strides[nd - 1] == 1 && b.strides[nd - 2] != 1 && K > 1;
  const bool b_col = b.strides[nd - 2] == 1 && b.strides[nd - 1] != 1 && N > 1;
  const int64_t lda = leading_dim(a), ldb = leading_dim(b);
  const bool big = M * K * N >= (int64_t{1} << 24);  // the copy is a small share of the work
  if (big && a_col && conflicting_ld(lda) && K >= 1024) {
    e.pad_a = lda + kLdPad;
  } else {
    e.repack_a = a_col && K >= 256 && M >= 1024 && N >= 128;
  }
  if (big && (b_row || b_col) && conflicting_ld(ldb)) {
    e.pad_b = ldb + kLdPad;
  } else {
    e.repack_b = b_row && M >= 64 && M <= 256 && K >= 512 && N >= 512;
  }
}

Entry create(const Operand& a, const Operand& b, bool has_bias, const memory::dims& out_dims,
             memory::data_type dt) {
  Entry e;
  dnnl::matmul::primitive_desc pd = describe_matmul(a, b, has_bias, out_dims, dt);
  choose_repacking(e, pd, a, b, dt);
  if (e.repack_a || e.repack_b || e.pad_a || e.pad_b) {
    const Operand ao = e.repack_a ? repacked(a) : e.pad_a ? padded(a, e.pad_a) : a;
    const Operand bo = e.repack_b ? repacked(b) : e.pad_b ? padded(b, e.pad_b) : b;
    pd = describe_matmul(ao, bo, has_bias, out_dims, dt);
  }
  // Note [Reference matmul]: oneDNN answers every layout with at least "ref:any", a naive
  // loop nest orders of magnitude slower than its GEMM. Such layouts are copied to contiguous
  // by the caller instead; the null entry caches that decision.
  if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return e;
  ++g_created;
  e.prim = std::make_shared<dnnl::matmul>(pd);
  e.scratch = pd.scratchpad_desc();
  return e;
}

// A copy of t (inner matrix [R, C]) stored in the operand layout `op` describes (not recorded
// by autograd): row-major is a dense copy, column-major a dense copy of the transpose.
Tensor repack(const Tensor& t, const Operand& op) {
  const size_t nd = op.dims.size();
  if (op.strides[nd - 1] == 1) return dense(t);
  Shape sz = t.sizes(), st = t.strides();
  std::swap(sz[nd - 1], sz[nd - 2]);
  std::swap(st[nd - 1], st[nd - 2]);
  Tensor packed = dense(as_strided(t, sz, st, t.storage_offset()));  // [.., C, R] contiguous
  Shape ps = packed.strides();
  std::swap(ps[nd - 1], ps[nd - 2]);
  return as_strided(packed, t.sizes(), ps, 0);
}

// A copy of t (inner matrix [R, C]) in the layout `op` describes: t's own orientation with a
// padded leading dimension (padded()). Its runs (rows, or columns when column-major) are
// contiguous in t, so they are copied with memcpy in parallel; the padding is left unset
// (never read).
Tensor pad_copy(const Tensor& t, const Operand& op) {
  const size_t nd = op.dims.size();
  const int64_t R = op.dims[nd - 2], C = op.dims[nd - 1];
  const bool rm = row_major(op);
  const int64_t ld = leading_dim(op);
  const int64_t runs = rm ? R : C, len = rm ? C : R;
  Tensor buf = Tensor::empty({runs * ld}, t.dtype(), t.device());
  Shape st(op.strides.begin(), op.strides.end());
  Tensor view = as_strided(buf, t.sizes(), st, 0);
  const int64_t tn = t.dim();
  const int64_t unit = rm ? t.stride(tn - 1) : t.stride(tn - 2);
  const int64_t src_ld = rm ? t.stride(tn - 2) : t.stride(tn - 1);
  if (unit != 1 && len > 1) {  // not reached for the layouts choose_repacking pads
    copy_into(view, t);
    return view;
  }
  const size_t es = t.element_size();
  const char* src = static_cast<const char*>(t.data_ptr());
  char* dst = static_cast<char*>(buf.data_ptr());
  parallel_for(runs, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t r = b; r < e; ++r) {
                   std::memcpy(dst + r * ld * es, src + r * src_ld * es, len * es);
                 }
               });
  return view;
}

}  // namespace

dnnl::engine& onednn_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& onednn_stream() {
  thread_local dnnl::stream s(onednn_engine());  // streams are not shared between threads
  return s;
}

// Note [Matmul kernel probe]: which implementation oneDNN dispatches for a dtype is read from
// the implementation string of a 256^3 primitive descriptor (a shape every kernel accepts; an
// 8 x 8 probe can select a small-matrix path instead of the one real products run). "ref..." is
// oneDNN's reference loop, far too slow to use: such dtypes are widened to fp32 instead.
std::string onednn_matmul_impl(DType t) {
  auto probe = [](memory::data_type dt) -> std::string {
    try {
      memory::desc md({256, 256}, dt, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), onednn_engine());
      return pd.impl_info_str();
    } catch (const dnnl::error&) {
      return "";
    }
  };
  static const std::array<std::string, kNumDTypes> impls = [&] {  // by DType, once each
    std::array<std::string, kNumDTypes> r;
    for (DType f : {DType::Float32, DType::BFloat16, DType::Float16}) {
      r[static_cast<size_t>(f)] = probe(to_dnnl(f));
    }
    return r;
  }();
  return impls[static_cast<size_t>(t)];
}

bool onednn_has_matmul(DType t) {
  const std::string impl = onednn_matmul_impl(t);
  return !impl.empty() && impl.rfind("ref", 0) != 0;
}

std::string onednn_cpu_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "unknown";
  }
}

int64_t onednn_primitives_created() {
  return g_created.load();
}

void onednn_matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out) {
  const int64_t nd = out.dim();
  TD_CHECK(nd >= 2 && nd <= 12 && a.dim() == nd && b.dim() == nd, "matmul: oneDNN takes 2 to 12 ",
           "dims, got ", shape_str(a.sizes()), " @ ", shape_str(b.sizes()));
  TD_CHECK(out.is_contiguous(), "matmul: internal error: destination must be contiguous");
  if (out.numel() == 0) return;
  const int64_t K = a.size(nd - 1);
  if (K == 0) {
    if (bias.defined())
      copy_into(out, bias);
    else
      Tensor(out).fill_(0.0);
    return;
  }
  Operand ao, bo;
  if (!describe_operand(a, ao)) return onednn_matmul(dense(a), b, bias, out);
  if (!describe_operand(b, bo)) return onednn_matmul(a, dense(b), bias, out);
  for (int64_t d = 0; d < nd - 2; ++d) {
    if (ao.dims[d] == 1 && bo.dims[d] == 1 && out.size(d) != 1) {
      // Both operands broadcast (stride 0) along a dim the output has: oneDNN infers the
      // output's batch dims from its inputs, so the one with the output's size there (stride
      // 0) is materialized; densifying the size-1 one would change nothing and recurse forever.
      if (a.size(d) != 1) return onednn_matmul(dense(a), b, bias, out);
      return onednn_matmul(a, dense(b), bias, out);
    }
  }
  memory::data_type dt = to_dnnl(out.dtype());
  Key key;
  key.reserve(4 * nd + 4);
  key.push_back(static_cast<int64_t>(out.dtype()));
  key.push_back(nd);
  key.push_back(bias.defined() ? 1 : 0);
  append(key, ao);
  append(key, bo);
  key.insert(key.end(), out.sizes().begin(), out.sizes().end());

  memory::dims od(out.sizes().begin(), out.sizes().end());
  std::optional<Entry> e = cache().find(key);
  if (!e) {
    try {
      e = create(ao, bo, bias.defined(), od, dt);
    } catch (const dnnl::error& err) {
      TD_ERROR("matmul: oneDNN could not create a primitive for ", describe(a), " @ ", describe(b),
               ": ", err.what());
    }
    cache().insert(key, *e);
  }
  if (!e->prim) {
    TD_CHECK(!a.is_contiguous() || !b.is_contiguous(), "matmul: oneDNN has only a reference ",
             "implementation for ", shape_str(a.sizes()), " @ ", shape_str(b.sizes()));
    return onednn_matmul(a.is_contiguous() ? a : dense(a), b.is_contiguous() ? b : dense(b), bias,
                         out);
  }
  Tensor ap = a, bp = b;  // Note [Operand layouts for sgemm]
  if (e->repack_a) {
    ao = repacked(ao);
    ap = repack(a, ao);
  }
  if (e->repack_b) {
    bo = repacked(bo);
    bp = repack(b, bo);
  }
  if (e->pad_a) {  // Note [Padded leading dimensions]
    ao = padded(ao, e->pad_a);
    ap = pad_copy(a, ao);
  }
  if (e->pad_b) {
    bo = padded(bo, e->pad_b);
    bp = pad_copy(b, bo);
  }
  dnnl::engine& eng = onednn_engine();
  memory am(memory::desc(ao.dims, dt, ao.strides), eng, ap.data_ptr());
  memory bm(memory::desc(bo.dims, dt, bo.strides), eng, bp.data_ptr());
  memory cm(dense_md(od, dt), eng, out.data_ptr());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias.defined()) {
    TD_CHECK(bias.is_contiguous() && bias.numel() == out.size(nd - 1),
             "matmul: internal error: bias must be contiguous [N]");
    args.emplace(DNNL_ARG_BIAS, memory(bias_md(od, dt), eng, bias.data_ptr()));
  }
  if (const size_t bytes = e->scratch.get_size(); bytes > 0) {  // Note [Matmul scratchpad]
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(e->scratch, eng, thread_scratch(bytes)));
  }
  e->prim->execute(onednn_stream(), args);
  onednn_stream().wait();
}

}  // namespace td::cpu
