// cuDNN SDPA graphs for attention (Note [cuDNN attention] in cudnn_attention.cuh). Compiled by the
// host compiler, not nvcc (the frontend is a large header-only C++ library); with
// TD_WITH_CUDNN_FRONTEND=0 (headers not found at configure time) every plan is refused.
#include "attention/cudnn_attention.cuh"

#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/cuda_check.cuh"
#include "tardelli/core/error.h"

#if TD_WITH_CUDNN_FRONTEND
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace td::kernels {

namespace {

thread_local AttentionBackend g_last_backend[2] = {AttentionBackend::None, AttentionBackend::None};

std::string describe(const AttentionShape& s, AttentionDType dt) {
  return ::td::detail::str_cat(dt == AttentionDType::BFloat16 ? "bf16" : "fp16", " B=", s.B,
                               " H=", s.H, " Hkv=", s.Hkv, " Tq=", s.Tq, " Tk=", s.Tk, " D=", s.D,
                               " Dv=", s.Dv, s.causal ? " causal" : " non-causal",
                               " scale=", s.scale);
}

}  // namespace

void note_attention_backend(bool backward, AttentionBackend b) {
  g_last_backend[backward] = b;
}
AttentionBackend last_attention_backend(bool backward) {
  return g_last_backend[backward];
}

#if !TD_WITH_CUDNN_FRONTEND

bool cudnn_attention_compiled() {
  return false;
}

namespace {
const CudnnAttentionPlan& not_compiled() {
  static const CudnnAttentionPlan plan{false, 0,
                                       "this build has no cuDNN frontend (its headers were not "
                                       "found at configure time; see cmake/cuda.cmake)"};
  return plan;
}
}  // namespace

const CudnnAttentionPlan& cudnn_attention_forward_plan(const AttentionShape&, AttentionDType) {
  return not_compiled();
}
const CudnnAttentionPlan& cudnn_attention_backward_plan(const AttentionShape&, AttentionDType,
                                                        bool) {
  return not_compiled();
}
void cudnn_attention_forward(const void*, const void*, const void*, void*, float*, void*,
                             const AttentionShape& s, AttentionDType dt, cudaStream_t) {
  throw Error("flash_attention_forward: cuDNN attention called for " + describe(s, dt) + ", but " +
              not_compiled().refusal);
}
void cudnn_attention_backward(const void*, const void*, const void*, const void*, const void*,
                              const float*, void*, void*, void*, void*, const AttentionShape& s,
                              AttentionDType dt, bool, cudaStream_t) {
  throw Error("flash_attention_backward: cuDNN attention called for " + describe(s, dt) + ", but " +
              not_compiled().refusal);
}

#else  // TD_WITH_CUDNN_FRONTEND

namespace fe = cudnn_frontend;

bool cudnn_attention_compiled() {
  return true;
}

namespace {

// Tensor uids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct GraphKey {
  int device;
  int dtype;
  int direction;  // 0 forward, 1 backward, 2 backward deterministic
  int64_t B, H, Hkv, Tq, Tk, D, Dv;
  bool causal;
  uint32_t scale_bits;
  auto operator<=>(const GraphKey&) const = default;
};

struct GraphEntry {
  CudnnAttentionPlan plan;
  std::shared_ptr<fe::graph::Graph> graph;  // set when plan.supported
};

// Per thread (a cuDNN handle must not be used by two threads at once; the graphs are built
// against it). Handles are not destroyed: at process exit the CUDA context may already be gone,
// and cudnnDestroy then fails (PyTorch leaks its handles for the same reason).
thread_local std::unordered_map<int, cudnnHandle_t> t_handles;
thread_local std::map<GraphKey, GraphEntry> t_graphs;

int current_device() {
  int dev = 0;
  TD_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

cudnnHandle_t handle_for(int device) {
  auto it = t_handles.find(device);
  if (it != t_handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  TD_CUDNN_CHECK(cudnnCreate(&h));  // on the current device, which is `device`
  t_handles.emplace(device, h);
  return h;
}

std::vector<int64_t> packed_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> st(dims.size(), 1);
  for (size_t i = dims.size() - 1; i > 0; --i) st[i - 1] = st[i] * dims[i];
  return st;
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr input(fe::graph::Graph& g, const char* name, int64_t uid,
                const std::vector<int64_t>& dims) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(
          packed_strides(dims)));
}

void mark_output(const TensorPtr& t, int64_t uid, const std::vector<int64_t>& dims) {
  t->set_output(true).set_uid(uid).set_dim(dims).set_stride(packed_strides(dims));
}

std::vector<int64_t> stats_dims(const AttentionShape& s) {
  return {s.B, s.H, s.Tq, 1};
}

TensorPtr stats_tensor(fe::graph::Graph& g, const AttentionShape& s) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("Stats")
                      .set_uid(kStats)
                      .set_dim(stats_dims(s))
                      .set_stride(packed_strides(stats_dims(s)))
                      .set_data_type(fe::DataType_t::FLOAT));
}

std::shared_ptr<fe::graph::Graph> new_graph(AttentionDType dt) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dt == AttentionDType::BFloat16 ? fe::DataType_t::BFLOAT16
                                                     : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Causal: query i sees keys j <= i + Tk - Tq (Note [cuDNN attention]: top-left when Tq == Tk).
template <typename Attrs>
void set_mask(Attrs& a, const AttentionShape& s) {
  if (!s.causal) return;
  a.set_diagonal_alignment(s.Tq == s.Tk ? fe::DiagonalAlignment_t::TOP_LEFT
                                        : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
      .set_diagonal_band_right_bound(0);
}

std::shared_ptr<fe::graph::Graph> forward_graph(const AttentionShape& s, AttentionDType dt) {
  auto g = new_graph(dt);
  TensorPtr q = input(*g, "Q", kQ, {s.B, s.H, s.Tq, s.D});
  TensorPtr k = input(*g, "K", kK, {s.B, s.Hkv, s.Tk, s.D});
  TensorPtr v = input(*g, "V", kV, {s.B, s.Hkv, s.Tk, s.Dv});
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("td_flash_attention_forward")
                   .set_generate_stats(true)
                   .set_attn_scale(s.scale);
  set_mask(attrs, s);
  auto [o, stats] = g->sdpa(q, k, v, attrs);
  mark_output(o, kO, {s.B, s.H, s.Tq, s.Dv});
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(s))
      .set_stride(packed_strides(stats_dims(s)));
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const AttentionShape& s, AttentionDType dt,
                                                 bool deterministic) {
  auto g = new_graph(dt);
  TensorPtr q = input(*g, "Q", kQ, {s.B, s.H, s.Tq, s.D});
  TensorPtr k = input(*g, "K", kK, {s.B, s.Hkv, s.Tk, s.D});
  TensorPtr v = input(*g, "V", kV, {s.B, s.Hkv, s.Tk, s.Dv});
  TensorPtr o = input(*g, "O", kO, {s.B, s.H, s.Tq, s.Dv});
  TensorPtr dout = input(*g, "dO", kDO, {s.B, s.H, s.Tq, s.Dv});
  TensorPtr stats = stats_tensor(*g, s);
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name("td_flash_attention_backward")
                   .set_attn_scale(s.scale)
                   .set_deterministic_algorithm(deterministic);
  set_mask(attrs, s);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, attrs);
  mark_output(dq, kDQ, {s.B, s.H, s.Tq, s.D});
  mark_output(dk, kDK, {s.B, s.Hkv, s.Tk, s.D});
  mark_output(dv, kDV, {s.B, s.Hkv, s.Tk, s.Dv});
  return g;
}

// Builds the graph for `key` once (Note [cuDNN attention]); any failure while building is a
// refusal with its reason, cached like a success.
template <typename Make>
const GraphEntry& plan_for(const GraphKey& key, Make make) {
  auto it = t_graphs.find(key);
  if (it != t_graphs.end()) return it->second;
  GraphEntry e;
  try {
    cudnnHandle_t h = handle_for(key.device);
    std::shared_ptr<fe::graph::Graph> g = make();
    auto step = [&](fe::error_t st, const char* what) {
      if (st.is_good()) return true;
      e.plan.refusal = ::td::detail::str_cat(what, ": ", st.get_message());
      return false;
    };
    int64_t ws = 0;
    if (step(g->validate(), "validate") &&
        step(g->build_operation_graph(h), "build_operation_graph") &&
        step(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") &&
        step(g->check_support(), "check_support") && step(g->build_plans(), "build_plans") &&
        step(g->get_workspace_size(ws), "get_workspace_size")) {
      e.plan.supported = true;
      e.plan.workspace_bytes = static_cast<size_t>(ws);
      e.graph = std::move(g);
    }
  } catch (const std::exception& ex) {  // the frontend throws for shapes no implementation takes
    e.plan.supported = false;
    e.plan.refusal = ex.what();
    e.graph.reset();
  }
  return t_graphs.emplace(key, std::move(e)).first->second;
}

GraphKey key_of(const AttentionShape& s, AttentionDType dt, int direction) {
  return GraphKey{current_device(),
                  static_cast<int>(dt),
                  direction,
                  s.B,
                  s.H,
                  s.Hkv,
                  s.Tq,
                  s.Tk,
                  s.D,
                  s.Dv,
                  s.causal,
                  std::bit_cast<uint32_t>(s.scale)};
}

void execute(const GraphKey& key, std::unordered_map<int64_t, void*>& pack, void* workspace,
             cudaStream_t stream, const char* op, const AttentionShape& s, AttentionDType dt) {
  auto it = t_graphs.find(key);
  if (it == t_graphs.end() || !it->second.plan.supported) {
    throw Error(::td::detail::str_cat(op, ": no cuDNN graph was planned for ", describe(s, dt)));
  }
  cudnnHandle_t h = handle_for(key.device);
  TD_CUDNN_CHECK(cudnnSetStream(h, stream));
  fe::error_t st = it->second.graph->execute(h, pack, workspace);
  if (st.is_bad()) {
    throw Error(::td::detail::str_cat(op, ": cuDNN SDPA execution failed for ", describe(s, dt),
                                      ": ", st.get_message()));
  }
}

}  // namespace

const CudnnAttentionPlan& cudnn_attention_forward_plan(const AttentionShape& s, AttentionDType dt) {
  return plan_for(key_of(s, dt, 0), [&] { return forward_graph(s, dt); }).plan;
}

const CudnnAttentionPlan& cudnn_attention_backward_plan(const AttentionShape& s, AttentionDType dt,
                                                        bool deterministic) {
  return plan_for(key_of(s, dt, deterministic ? 2 : 1),
                  [&] { return backward_graph(s, dt, deterministic); })
      .plan;
}

void cudnn_attention_forward(const void* q, const void* k, const void* v, void* out, float* lse,
                             void* workspace, const AttentionShape& s, AttentionDType dt,
                             cudaStream_t stream) {
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)},
                                             {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)},
                                             {kO, out},
                                             {kStats, lse}};
  execute(key_of(s, dt, 0), pack, workspace, stream, "flash_attention_forward", s, dt);
}

void cudnn_attention_backward(const void* grad_out, const void* q, const void* k, const void* v,
                              const void* out, const float* lse, void* dq, void* dk, void* dv,
                              void* workspace, const AttentionShape& s, AttentionDType dt,
                              bool deterministic, cudaStream_t stream) {
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)},
                                             {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)},
                                             {kO, const_cast<void*>(out)},
                                             {kDO, const_cast<void*>(grad_out)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDQ, dq},
                                             {kDK, dk},
                                             {kDV, dv}};
  execute(key_of(s, dt, deterministic ? 2 : 1), pack, workspace, stream, "flash_attention_backward",
          s, dt);
}

#endif  // TD_WITH_CUDNN_FRONTEND

}  // namespace td::kernels
