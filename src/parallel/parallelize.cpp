#include "tardelli/parallel/parallelize.h"

#include <algorithm>
#include <vector>

#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/activation_linear.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/embedding.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"
#include "tardelli/ops/loss.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/parallel/tensor_parallel.h"
#include "tardelli/parallel/vocab_parallel.h"

namespace td::parallel {

namespace dist = td::distributed;

namespace {
constexpr int64_t kSeqDim = 1;  // the GPT's activations are [B, T, d]

// The max of v over `group` (an FP8 amax over the ranks holding parts of a tensor). An amax is
// the |value| of a float32 (or narrower) element: exact in float32, and a max is exact in any
// order, so every rank gets the same result.
double group_max(const dist::CommPtr& group, double v) {
  Tensor t = full({1}, v, {DType::Float32});
  group->all_reduce(t, dist::ReduceOp::Max);
  return t.item<double>();
}
}  // namespace

GPTTensorParallel::GPTTensorParallel(dist::CommPtr tp, const ParallelOptions& options,
                                     uint64_t seed)
    : tp_(std::move(tp)), options_(options) {
  TD_CHECK(tp_ != nullptr, "GPTTensorParallel: the tensor-parallel communicator is null");
  TD_CHECK(options_.make_vocab_size_divisible_by > 0,
           "GPTTensorParallel: make_vocab_size_divisible_by must be > 0, got ",
           options_.make_vocab_size_divisible_by);
  rng_ = RngTracker::model_parallel(seed, tp_->rank());
}

int64_t GPTTensorParallel::padded_vocab(int64_t vocab_size) const {
  return padded_vocab_size(vocab_size, tp_->size(), options_.make_vocab_size_divisible_by);
}

Tensor GPTTensorParallel::column_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                                        const models::LinearFn& gemm) {
  return column_parallel_linear(x, w, b, tp_, /*gather_output=*/false, sp, kSeqDim, gemm);
}

Tensor GPTTensorParallel::row_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                                     std::optional<MlpActivation> act,
                                     const models::LinearFn& gemm) {
  return row_parallel_linear(x, w, b, tp_, /*input_is_parallel=*/true, sp, kSeqDim, act, gemm);
}

double GPTTensorParallel::tp_max(double v) {
  return group_max(tp_, v);
}

Tensor GPTTensorParallel::embedding(const Tensor& ids, const Tensor& w, bool sp) {
  const int64_t start = vocab_range(w.size(0) * tp_->size(), tp_->rank(), tp_->size()).start;
  return vocab_parallel_embedding(ids, w, tp_, start, sp, kSeqDim);
}

Tensor GPTTensorParallel::replicated(const Tensor& p) {
  return dist::copy_to_region(p, tp_);
}

// The head is a column-parallel layer over the vocabulary (under sp it gathers the sequence
// first), and the loss reduces over tp without gathering the logits; like the one-device head
// it is chunked over tokens (fp32 softmax), so no [tokens, V_pad/tp] tensor is kept.
Tensor GPTTensorParallel::loss(const Tensor& h, const Tensor& w, const Tensor& targets,
                               int64_t vocab_size, int64_t ignore_index, bool sp) {
  // The column-parallel input step (all-gather under sp, else copy_to_region), then the head
  // and loss fused and chunked over tokens: no [tokens, V_pad/tp] logits are kept for backward.
  Tensor x = sp ? dist::gather_from_sequence(h, tp_, kSeqDim, /*tp_output_grad=*/true)
                : dist::copy_to_region(h, tp_);
  const int64_t n = x.size(0) * x.size(1), vs = w.size(0);
  const int64_t start = vocab_range(vs * tp_->size(), tp_->rank(), tp_->size()).start;
  return vocab_parallel_linear_cross_entropy(x.reshape({n, x.size(2)}), w, targets.reshape({n}),
                                             tp_, start, vocab_size, ignore_index);
}

// Under sp the gathered hidden states feed a column layer, whose copy_to_region already
// all-reduces their gradient: the gather's backward only keeps this rank's chunk.
Tensor GPTTensorParallel::logits(const Tensor& h, const Tensor& w, int64_t vocab_size, bool sp) {
  Tensor x = sp ? dist::gather_from_sequence(h, tp_, kSeqDim, /*tp_output_grad=*/false) : h;
  Tensor full = column_parallel_linear(x, w, Tensor(), tp_, /*gather_output=*/true, false);
  return full.size(2) == vocab_size ? full : full.narrow(2, 0, vocab_size).contiguous();
}

void apply_tensor_parallel(models::GPT& model, const dist::CommPtr& tp,
                           const ParallelOptions& options) {
  TD_CHECK(tp != nullptr, "apply_tensor_parallel: the tensor-parallel communicator is null");
  TD_CHECK(!options.sequence_parallel || tp->size() > 1,
           "apply_tensor_parallel: sequence parallelism needs tensor parallelism (tp > 1); "
           "the tp group has size ",
           tp->size());
  if (tp->size() == 1) return;
  // A pipeline stage's split stream is offset by its first layer (Note [Stage dropout streams]
  // in gpt.cpp): chunks on one rank must not share masks.
  const uint64_t seed =
      model.config().seed + 100 * static_cast<uint64_t>(model.stage().first_layer);
  model.set_parallelism(std::make_shared<GPTTensorParallel>(tp, options, seed));
}

GPTContextParallel::GPTContextParallel(std::shared_ptr<GPTTensorParallel> tp, dist::CommPtr cp,
                                       CPComm comm, uint64_t seed)
    : tp_(std::move(tp)), cp_(std::move(cp)), comm_(comm), gen_(seed, 0xC9) {
  TD_CHECK(cp_ != nullptr, "GPTContextParallel: the context-parallel communicator is null");
}

int64_t GPTContextParallel::padded_vocab(int64_t vocab_size) const {
  return tp_ ? tp_->padded_vocab(vocab_size) : vocab_size;
}

Tensor GPTContextParallel::column_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                                         const models::LinearFn& gemm) {
  if (tp_) return tp_->column_linear(x, w, b, sp, gemm);
  return gemm ? gemm(x, w, b) : linear(x, w, b);
}

Tensor GPTContextParallel::row_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                                      std::optional<MlpActivation> act,
                                      const models::LinearFn& gemm) {
  if (tp_) return tp_->row_linear(x, w, b, sp, act, gemm);
  if (gemm) return gemm(act ? mlp_activation(x, *act) : x, w, b);
  return act ? activation_linear(x, *act, w, b) : linear(x, w, b);
}

double GPTContextParallel::tp_max(double v) {
  return tp_ ? tp_->tp_max(v) : v;
}

double GPTContextParallel::cp_max(double v) {
  return group_max(cp_, v);
}

Tensor GPTContextParallel::embedding(const Tensor& ids, const Tensor& w, bool sp) {
  return tp_ ? tp_->embedding(ids, w, sp) : td::embedding(w, ids);
}

Tensor GPTContextParallel::replicated(const Tensor& p) {
  return tp_ ? tp_->replicated(p) : p;
}

// The one-device head is GPT::head's (fused and chunked over tokens); the tp one the vocab-
// parallel loss. Either gives this rank's mean, averaged over cp (Note [Context-parallel loss]).
// Note [Ignored targets under cp]: when ignore_index leaves the ranks different numbers of
// counted targets n_r (N = total), the mean over all tokens is sum_r n_r mean_r / N: each rank's
// mean is weighted by cp * n_r / N before the average (the gradient, through the identity
// backward and the dp x cp averaging, is then sum_r (n_r / N) grad mean_r). Equal counts (no
// ignored targets, or as many on every rank) keep the plain average. A rank with no counted
// target contributes weight 0 (its mean, 0/0, is replaced by 0).
Tensor GPTContextParallel::loss(const Tensor& h, const Tensor& w, const Tensor& targets,
                                int64_t vocab_size, int64_t ignore_index, bool sp) {
  Tensor local;
  if (tp_) {
    local = tp_->loss(h, w, targets, vocab_size, ignore_index, sp);
  } else {
    const int64_t n = h.size(0) * h.size(1);
    local = linear_cross_entropy(h.reshape({n, h.size(2)}), w, targets.reshape({n}), ignore_index);
  }
  int64_t count = 0;
  for (int64_t t : to_vector<int64_t>(targets.to(kCPU).to(DType::Int64)))
    count += t != ignore_index ? 1 : 0;
  const int n = cp_->size();
  Tensor counts = Tensor::empty({n}, DType::Int64);
  cp_->all_gather(counts, full({1}, static_cast<double>(count), {DType::Int64}));
  const std::vector<int64_t> all = to_vector<int64_t>(counts);
  int64_t total = 0;
  for (int64_t c : all) total += c;
  if (std::all_of(all.begin(), all.end(), [&](int64_t c) { return c == all[0]; }))
    return context_parallel_loss_mean(local, cp_);
  if (count == 0) {
    // 0 instead of NaN, still in the graph (backward reaches every parameter with zeros).
    return context_parallel_loss_mean(
        masked_fill(local, ones(local.sizes(), {DType::Bool, local.device()}), 0.0), cp_);
  }
  return context_parallel_loss_mean(mul(local, static_cast<double>(n) * count / total), cp_);
}

Tensor GPTContextParallel::logits(const Tensor& h, const Tensor& w, int64_t vocab_size, bool sp) {
  return tp_ ? tp_->logits(h, w, vocab_size, sp) : linear(h, w);
}

std::vector<int64_t> GPTContextParallel::positions(int64_t local_T) const {
  return zigzag_positions(local_T * cp_->size(), cp_->rank(), cp_->size());
}

Tensor GPTContextParallel::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                     bool causal) {
  return context_parallel_attention(q, k, v, cp_, causal, comm_);
}

void apply_parallelism(models::GPT& model, const dist::CommPtr& tp, const dist::CommPtr& cp,
                       const ParallelOptions& options) {
  TD_CHECK(tp != nullptr && cp != nullptr, "apply_parallelism: a communicator is null");
  if (cp->size() == 1) return apply_tensor_parallel(model, tp, options);
  TD_CHECK(!options.sequence_parallel || tp->size() > 1,
           "apply_parallelism: sequence parallelism needs tensor parallelism (tp > 1); the tp "
           "group has size ",
           tp->size());
  const models::GPTConfig& c = model.config();
  const int n = cp->size(), t = tp->size();
  if (options.cp_comm == CPComm::AllToAll) {
    TD_CHECK(c.n_head % t == 0 && (c.n_head / t) % n == 0 && (c.kv_heads() / t) % n == 0 &&
                 c.kv_heads() % t == 0,
             "apply_parallelism: cp_comm=a2a splits each tp rank's heads over cp = ", n,
             ": n_head ", c.n_head, " / tp ", t, " and n_kv_head ", c.kv_heads(), " / tp ", t,
             " must be divisible by cp (use cp_comm=ring)");
  }
  const uint64_t seed = c.seed + 100 * static_cast<uint64_t>(model.stage().first_layer);
  auto tpl = t > 1 ? std::make_shared<GPTTensorParallel>(tp, options, seed) : nullptr;
  model.set_parallelism(std::make_shared<GPTContextParallel>(tpl, cp, options.cp_comm, seed));
}

void parallelize(models::GPT& model, const dist::ProcessGrid& grid,
                 const ParallelOptions& options) {
  const dist::ParallelDims& d = grid.dims();
  const models::GPTStage& stage = model.stage();
  TD_CHECK(d.pp == 1 || !(stage.pre && stage.post), "parallelize: the grid has pp=", d.pp,
           " but the model is the whole GPT: build this rank's pipeline chunks with "
           "build_pipeline_stages (parallel/pipeline_runtime.h) and parallelize each");
  apply_parallelism(model, grid.tp(), grid.cp(), options);
}

}  // namespace td::parallel
