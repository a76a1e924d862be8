#include "tardelli/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "tardelli/autograd/checkpoint.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/activation.h"
#include "tardelli/ops/activation_linear.h"
#include "tardelli/ops/attention.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/dropout.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/embedding.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"
#include "tardelli/ops/join.h"
#include "tardelli/ops/loss.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/moe_router.h"
#include "tardelli/ops/norm.h"
#include "tardelli/ops/rotary.h"
#include "tardelli/ops/view.h"

namespace td::models {

namespace {

// Split indices of the cp ranks' dropout streams (Note [Dropout streams]).
constexpr uint64_t kCpDropoutStreams = 0xC90000;

// FNV-1a: a stable 64-bit id of a parameter's full name (its init stream, Note [Init streams]).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::shared_ptr<nn::Module> child(nn::Module& parent, const std::string& name,
                                  const std::string& type) {
  return parent.register_module(name, std::make_shared<nn::Module>(type));
}

// Restores the training flag on scope exit (generate runs in eval semantics).
class TrainingFlagGuard {
 public:
  explicit TrainingFlagGuard(nn::Module& m) : m_(m), was_(m.is_training()) { m_.train(false); }
  ~TrainingFlagGuard() { m_.train(was_); }
  TrainingFlagGuard(const TrainingFlagGuard&) = delete;
  TrainingFlagGuard& operator=(const TrainingFlagGuard&) = delete;

 private:
  nn::Module& m_;
  bool was_;
};

// One token from a row of fp32 logits (semantics in gpt.h). `u` is uniform in [0, 1).
int64_t sample_row(const float* logits, int64_t V, double temperature, int64_t top_k, float u) {
  if (temperature <= 0.0 || top_k == 1) {
    return std::max_element(logits, logits + V) - logits;  // first maximum
  }
  std::vector<double> z(logits, logits + V);
  for (double& x : z) x /= temperature;
  if (top_k > 0 && top_k < V) {
    // torch/nanoGPT: everything strictly below the k-th largest value is dropped.
    std::vector<double> tmp = z;
    std::nth_element(tmp.begin(), tmp.begin() + (top_k - 1), tmp.end(), std::greater<double>());
    const double kth = tmp[top_k - 1];
    for (double& x : z) {
      if (x < kth) x = -INFINITY;
    }
  }
  const double mx = *std::max_element(z.begin(), z.end());
  double total = 0.0;
  for (double& x : z) {
    x = std::exp(x - mx);
    total += x;
  }
  const double target = static_cast<double>(u) * total;
  double acc = 0.0;
  int64_t last = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (z[i] == 0.0) continue;
    last = i;
    acc += z[i];
    if (acc > target) return i;
  }
  return last;  // rounding left target above the final sum: the last token with mass
}

}  // namespace

int64_t ffn_hidden_size(const GPTConfig& c) {
  if (c.ffn_hidden > 0) return c.ffn_hidden;
  if (c.arch == Arch::GPT2) return 4 * c.d_model;
  const int64_t raw = (2 * 4 * c.d_model) / 3;
  return (raw + 63) / 64 * 64;
}

// Note [Init streams]: each parameter is drawn from Generator(seed).split(fnv1a(full name)), a
// Philox subsequence of its own, so its values depend only on the seed, its name and its shape.
// Creation order, the number of other parameters, and any later sharding of the model cannot
// change them (a shard can regenerate its slice of the full tensor from the same stream).
GPT::GPT(GPTConfig config, GPTStage stage)
    : nn::Module("GPT"),
      config_(std::move(config)),
      stage_(stage),
      dropout_gen_(config_.seed, 0xD409) {
  config_.validate();
  if (stage_.num_layers < 0) stage_.num_layers = config_.n_layer - stage_.first_layer;
  TD_CHECK(stage_.first_layer >= 0 && stage_.num_layers >= 0 &&
               stage_.first_layer + stage_.num_layers <= config_.n_layer,
           "GPT: stage layers [", stage_.first_layer, ", ", stage_.first_layer + stage_.num_layers,
           ") are outside the model's ", config_.n_layer, " layers");
  TD_CHECK(stage_.num_layers > 0 || stage_.pre || stage_.post,
           "GPT: a stage must hold at least one layer, the embeddings or the head");
  // Note [Stage dropout streams]: each pipeline stage draws from its own subsequence (keyed by
  // its first layer), so stages never repeat one another's masks (Megatron offsets its seed by
  // the pp rank for the same reason). The whole model keeps its original stream.
  if (!stage_.whole(config_.n_layer))
    dropout_gen_.set_state(config_.seed, 0, 0xD409 + 1 + static_cast<uint64_t>(stage_.first_layer));
  ff_ = ffn_hidden_size(config_);
  const bool gpt2 = config_.arch == Arch::GPT2;
  const int64_t d = config_.d_model, V = config_.vocab_size, L = config_.n_layer;
  const int64_t H = config_.n_head, Hkv = config_.kv_heads(), hd = config_.head_dim();
  const double std_w = 0.02, std_proj = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
  const Generator root(config_.seed);
  autograd::NoGradGuard ng;

  auto normal = [&](const std::string& name, const Shape& s, double std) {
    Generator g = root.split(fnv1a(name));
    Tensor t = randn(s, {}, &g);
    mul_(t, std);
    return t;
  };
  // A Linear child of `parent` (weight, and a bias for gpt2); `prefix` is parent's full name.
  auto linear_mod = [&](nn::Module& parent, const std::string& prefix, const std::string& name,
                        int64_t out, int64_t in, double std, Tensor& w, Tensor& b) {
    auto m = child(parent, name, "Linear");
    const std::string full = prefix + name;
    w = m->register_parameter("weight", normal(full + ".weight", {out, in}, std));
    if (gpt2) b = m->register_parameter("bias", zeros({out}));
  };
  auto norm_mod = [&](nn::Module& parent, const std::string& name, Tensor& w, Tensor& b) {
    auto m = child(parent, name, gpt2 ? "LayerNorm" : "RMSNorm");
    w = m->register_parameter("weight", ones({d}));
    if (gpt2) b = m->register_parameter("bias", zeros({d}));
  };

  // The tied gpt2 head needs the table on a post stage too (Note [Stage parameters]).
  if (stage_.pre || (gpt2 && stage_.post)) {
    auto wte = child(*this, "wte", "Embedding");
    wte_ = wte->register_parameter("weight", normal("wte.weight", {V, d}, std_w));
  }
  if (gpt2 && stage_.pre) {
    auto wpe = child(*this, "wpe", "Embedding");
    wpe_ = wpe->register_parameter("weight", normal("wpe.weight", {config_.block_size, d}, std_w));
  }
  auto h = child(*this, "h", "ModuleList");
  layers_.resize(static_cast<size_t>(stage_.num_layers));
  for (int64_t i = stage_.first_layer; i < stage_.first_layer + stage_.num_layers; ++i) {
    Layer& l = layers_[static_cast<size_t>(i - stage_.first_layer)];
    const std::string pre = "h." + std::to_string(i) + ".";
    auto blk = child(*h, std::to_string(i), "Block");
    norm_mod(*blk, "ln_1", l.ln_1_w, l.ln_1_b);
    auto attn = child(*blk, "attn", "CausalSelfAttention");
    linear_mod(*attn, pre + "attn.", "c_attn", (H + 2 * Hkv) * hd, d, std_w, l.c_attn_w,
               l.c_attn_b);
    linear_mod(*attn, pre + "attn.", "c_proj", d, H * hd, std_proj, l.attn_proj_w, l.attn_proj_b);
    norm_mod(*blk, "ln_2", l.ln_2_w, l.ln_2_b);
    if (config_.is_moe_layer(i)) {
      l.moe = register_moe_mlp(*blk, i, config_, std_w, std_proj, normal);
      l.moe_index = static_cast<int64_t>(moe_stats_.layers.size());
      moe_stats_.layers.emplace_back().layer = i;
      continue;
    }
    auto mlp = child(*blk, "mlp", "MLP");
    linear_mod(*mlp, pre + "mlp.", "c_fc", gpt2 ? ff_ : 2 * ff_, d, std_w, l.c_fc_w, l.c_fc_b);
    linear_mod(*mlp, pre + "mlp.", "c_proj", d, ff_, std_proj, l.mlp_proj_w, l.mlp_proj_b);
  }
  reset_moe_stats();
  if (stage_.post) {
    norm_mod(*this, "ln_f", ln_f_w_, ln_f_b_);
    auto head = child(*this, "lm_head", "Linear");
    // gpt2 ties the head to the token embedding: the same tensor, so named_parameters lists it
    // once (as wte.weight) and both uses accumulate into one gradient.
    lm_head_ =
        head->register_parameter("weight", gpt2 ? wte_ : normal("lm_head.weight", {V, d}, std_w));
    full_shapes_["lm_head.weight"] = {V, d};
  }
  if (!gpt2) std::tie(rope_cos_, rope_sin_) = rope_cache(config_.block_size, hd, config_.rope_base);
  for (auto& [name, p] : named_parameters()) full_shapes_[name] = p.sizes();
  linears_ = BlockLinears(4 * layers_.size());
}

std::vector<std::pair<std::string, Tensor*>> GPT::slots() {
  const bool gpt2 = config_.arch == Arch::GPT2;
  std::vector<std::pair<std::string, Tensor*>> s;
  if (wte_.defined()) s.emplace_back("wte.weight", &wte_);
  if (wpe_.defined()) s.emplace_back("wpe.weight", &wpe_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    const std::string pre =
        "h." + std::to_string(stage_.first_layer + static_cast<int64_t>(i)) + ".";
    const std::pair<const char*, Tensor*> fields[] = {{"ln_1.weight", &l.ln_1_w},
                                                      {"ln_1.bias", &l.ln_1_b},
                                                      {"attn.c_attn.weight", &l.c_attn_w},
                                                      {"attn.c_attn.bias", &l.c_attn_b},
                                                      {"attn.c_proj.weight", &l.attn_proj_w},
                                                      {"attn.c_proj.bias", &l.attn_proj_b},
                                                      {"ln_2.weight", &l.ln_2_w},
                                                      {"ln_2.bias", &l.ln_2_b},
                                                      {"mlp.c_fc.weight", &l.c_fc_w},
                                                      {"mlp.c_fc.bias", &l.c_fc_b},
                                                      {"mlp.c_proj.weight", &l.mlp_proj_w},
                                                      {"mlp.c_proj.bias", &l.mlp_proj_b}};
    for (const auto& [n, t] : fields) {
      if (t->defined()) s.emplace_back(pre + n, t);
    }
    for (const auto& [n, t] : l.moe.slots()) s.emplace_back(pre + "mlp." + n, t);
  }
  if (stage_.post) {
    s.emplace_back("ln_f.weight", &ln_f_w_);
    if (gpt2) s.emplace_back("ln_f.bias", &ln_f_b_);
    if (!gpt2) s.emplace_back("lm_head.weight", &lm_head_);
  }
  return s;
}

Shape GPT::full_shape(const std::string& name) const {
  auto it = full_shapes_.find(name);
  TD_CHECK(it != full_shapes_.end(), "GPT: no parameter named '", name, "'");
  return it->second;
}

// The column-parallel weights split their output rows per segment (Note [Shard specs]): the
// fused QKV weight's q, k and v row blocks separately (so a shard holds its own heads of each)
// and llama's fused gate/up weight's two halves; the row-parallel projections split their
// input columns; the vocabulary tables split their (padded) rows.
nn::ShardSpec GPT::shard_spec(const std::string& name) const {
  const Shape full = full_shape(name);
  if (!parallel_ || parallel_->tp_size() == 1) return {};
  const int tp = parallel_->tp_size(), r = parallel_->tp_rank();
  const auto ends = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  const int64_t hd = config_.head_dim();
  if (name == "wte.weight" || name == "lm_head.weight")
    return nn::ShardSpec::split(0, parallel_->padded_vocab(config_.vocab_size), tp, r);
  if (ends(".attn.c_attn.weight") || ends(".attn.c_attn.bias")) {
    const int64_t kv = config_.kv_heads() * hd;
    return {0, {config_.n_head * hd, kv, kv}, tp, r};
  }
  if (ends(".mlp.c_fc.weight") || ends(".mlp.c_fc.bias")) {
    if (config_.arch == Arch::GPT2) return nn::ShardSpec::split(0, ff_, tp, r);
    return {0, {ff_, ff_}, tp, r};
  }
  if (ends(".attn.c_proj.weight") || ends(".mlp.c_proj.weight"))
    return nn::ShardSpec::split(1, full[1], tp, r);
  return {};
}

void GPT::set_parallelism(std::shared_ptr<GPTParallelism> p) {
  TD_CHECK(p != nullptr, "GPT.set_parallelism: the layout is null");
  TD_CHECK(parallel_ == nullptr, "GPT.set_parallelism: a layout (tp=", parallel_->tp_size(),
           ") is already installed; build a new model to lay it out again");
  const int tp = p->tp_size();
  TD_CHECK(tp >= 1, "GPT.set_parallelism: tp size ", tp, " must be >= 1");
  // Note [MoE under tensor parallelism]: the MoE layers are not split over tp. Without sequence
  // parallelism every tp rank holds the whole hidden states after attention, so each runs the
  // router and its experts on the same tokens (replicated parameters with equal gradients, like
  // the norms; the input gradient is whole, no tp reduction). With sequence parallelism or
  // context parallelism the ranks hold different tokens, and the router statistics and expert
  // gradients would need a tp (cp) reduction that is not written yet.
  TD_CHECK(config_.num_experts == 0 || (!p->sequence_parallel() && p->cp_size() == 1),
           "GPT.set_parallelism: mixture-of-experts models (num_experts=", config_.num_experts,
           ") support tensor parallelism without sequence parallelism only, and no context "
           "parallelism yet (tp=",
           tp, ", sequence_parallel=", p->sequence_parallel(), ", cp=", p->cp_size(), ")");
  TD_CHECK(config_.n_head % tp == 0, "GPT.set_parallelism: n_head ", config_.n_head,
           " is not divisible by the tensor-parallel size ", tp, " (attention splits heads)");
  TD_CHECK(config_.kv_heads() % tp == 0, "GPT.set_parallelism: n_kv_head ", config_.kv_heads(),
           " is not divisible by the tensor-parallel size ", tp,
           " (grouped-query attention splits the key/value heads too)");
  TD_CHECK(ff_ % tp == 0, "GPT.set_parallelism: the MLP hidden size ", ff_,
           " (ffn_hidden) is not divisible by the tensor-parallel size ", tp);
  const int64_t vpad = p->padded_vocab(config_.vocab_size);
  TD_CHECK(vpad >= config_.vocab_size && vpad % tp == 0, "GPT.set_parallelism: padded vocabulary ",
           vpad, " must be >= vocab_size ", config_.vocab_size, " and divisible by tp ", tp);
  parallel_ = std::move(p);
  autograd::NoGradGuard ng;
  for (auto& [name, slot] : slots()) replace_parameter(name, slot, shard_spec(name).take(*slot));
  if (config_.arch == Arch::GPT2 && stage_.post) {
    lm_head_ = wte_;  // still tied: the head uses the same (sharded) table
    set_parameter("lm_head.weight", wte_);
  }
}

void GPT::replace_parameter(const std::string& name, Tensor* slot, Tensor value) {
  value.set_requires_grad(true);
  *slot = value;
  set_parameter(name, value);
}

Tensor GPT::cast(const Tensor& p) const {
  if (!p.defined() || p.dtype() == config_.dtype) return p;
  if (units_) {
    if (auto c = units_->compute_param(p, config_.dtype)) return *c;  // gathered in dtype
  }
  return to_dtype(p, config_.dtype);
}

// Under sequence parallelism the norms see this rank's tokens only, so their (replicated)
// weights get partial gradients: replicated() all-reduces them over tp in backward.
Tensor GPT::norm(const Tensor& x, const Tensor& w, const Tensor& b, bool sp) const {
  const int64_t d = config_.d_model;
  const auto param = [&](const Tensor& p) {
    if (!sp || !p.defined()) return cast(p);
    if (units_ && p.dtype() != config_.dtype) {
      // ZeRO-3 gathering in the compute dtype: the fp32 weight holds no bytes, its copy does.
      if (auto c = units_->compute_param(p, config_.dtype)) return parallel_->replicated(*c);
    }
    return cast(parallel_->replicated(p));
  };
  if (config_.arch == Arch::GPT2) return layer_norm(x, {d}, param(w), param(b), config_.norm_eps);
  return rms_norm(x, {d}, param(w), config_.norm_eps);
}

// Note [Dropout streams]: replicated activations (every tp rank holds the same values) draw
// from the model's stream, identical on all tp ranks, so the replicas stay equal; split
// activations (sequence parallel) draw from the layout's per-rank stream.
// Under context parallelism each cp rank holds other tokens, so the same masks on every cp rank
// would correlate the dropout of tokens far apart. A cp rank draws from its own subsequence of
// the stream (split by cp rank) at the stream's current offset, and the stream then advances as
// it would have: every cp rank's stream state stays the same (the draws have the same size),
// so the saved state (cp rank 0's, in the checkpoint) and recomputation's replay of it
// reproduce every rank's masks.
Tensor GPT::maybe_dropout(const Tensor& x, bool sp) {
  if (!is_training() || config_.dropout <= 0.0) return x;
  Generator& stream = sp ? parallel_->split_generator() : dropout_gen_;
  if (!parallel_ || parallel_->cp_size() == 1) return dropout(x, config_.dropout, true, &stream);
  Generator mine = stream.split(kCpDropoutStreams + static_cast<uint64_t>(parallel_->cp_rank()));
  mine.set_state(stream.seed(), stream.offset(), mine.subsequence());
  Tensor y = dropout(x, config_.dropout, true, &mine);
  stream.set_state(stream.seed(), mine.offset(), stream.subsequence());
  return y;
}

// Note [Linear precision] (models/precision_policy.h). Under tensor parallelism a column
// layer's weight and output gradient are shards (its input is gathered whole), a row layer's
// input and weight (its output gradient is whole): their amaxes are the max over tp. Under
// context parallelism every layer's input and output gradient hold this rank's part of the
// sequence (the weights are replicated): their amaxes are also the max over cp.
LinearFn GPT::block_gemm(size_t li, const Tensor& w, const Tensor& b, bool row) const {
  const Fp8Amax amaxes =
      is_training() && autograd::grad_enabled() ? Fp8Amax::Observe : Fp8Amax::Ignore;
  TD_CHECK(!units_ || (linears_.precision(li) != LinearPrecision::FP32 && !linears_.monitor()),
           "GPT: block linear ", linear_names()[li], " in ", precision_name(linears_.precision(li)),
           linears_.monitor() ? " with precision statistics" : "",
           " needs its fp32 weight, which ZeRO-3 parameter units release between uses");
  Fp8Shards shards;
  if (parallel_ && parallel_->tp_size() > 1) {
    auto tp_max = [p = parallel_](double v) { return p->tp_max(v); };
    shards.weight = tp_max;
    (row ? shards.input : shards.grad) = tp_max;
  }
  if (parallel_ && parallel_->cp_size() > 1) {
    for (std::function<double(double)>* f : {&shards.input, &shards.grad}) {
      *f = [p = parallel_, inner = *f](double v) { return p->cp_max(inner ? inner(v) : v); };
    }
  }
  return linears_.gemm(li, w, b, amaxes, shards);
}

Tensor GPT::column(const Tensor& x, const Tensor& w, const Tensor& b, bool sp, size_t li) const {
  const LinearFn gemm = block_gemm(li, w, b, /*row=*/false);
  if (parallel_) return parallel_->column_linear(x, cast(w), cast(b), sp, gemm);
  return gemm ? gemm(x, cast(w), cast(b)) : linear(x, cast(w), cast(b));
}

Tensor GPT::row(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                std::optional<MlpActivation> act, size_t li) const {
  const LinearFn gemm = block_gemm(li, w, b, /*row=*/true);
  if (parallel_) return parallel_->row_linear(x, cast(w), cast(b), sp, act, gemm);
  if (gemm) return gemm(act ? mlp_activation(x, *act) : x, cast(w), cast(b));
  if (act) return activation_linear(x, *act, cast(w), cast(b));
  return linear(x, cast(w), cast(b));
}

void GPT::set_fp8(int64_t history, double margin, Fp8Recipe recipe) {
  linears_.set_fp8(history, margin, recipe);
}

std::vector<std::string> GPT::linear_names() const {
  return block_linear_names(stage_.first_layer, static_cast<int64_t>(layers_.size()));
}

// Note [Fused QKV views]: q, k and v are column ranges of the one c_attn GEMM output
// [B, T, (H+2Hkv)*hd]; split + view + permute give [B, heads, T, hd] views of it with no copy
// (rotary reads its input through strides and writes the rotated q/k contiguously). Attention
// takes any strides, so the only copy in the block is the [B,H,T,hd] -> [B,T,H*hd] relayout of
// its output before c_proj.
// Under a tensor-parallel layout H and Hkv (and the MLP width) are this rank's shares (the weights
// are its shards, Note [GPT tensor-parallel layout]); under sequence parallelism x is this rank's
// chunk of T and the column layer gathers the whole sequence.
Tensor GPT::block(const Layer& l, const Tensor& x, int64_t start, KVCache* cache, size_t layer,
                  bool sp, bool fuse_act, BlockAux* aux) {
  const int tp = parallel_ ? parallel_->tp_size() : 1;
  const int64_t H = config_.n_head / tp, Hkv = config_.kv_heads() / tp, hd = config_.head_dim();
  const int64_t unit = 2 + static_cast<int64_t>(layer);
  use_unit(unit);
  const size_t li = 4 * layer;  // this block's linears in block_linears()
  Tensor qkv = column(norm(x, l.ln_1_w, l.ln_1_b, sp), l.c_attn_w, l.c_attn_b, sp, li);
  const int64_t B = qkv.size(0), T = qkv.size(1);
  // One split, not three narrows: its backward writes the three gradients into one buffer
  // (Note [Split backward]).
  TensorList parts = split(qkv, {H * hd, Hkv * hd, Hkv * hd}, 2);
  Tensor q = parts[0].view({B, T, H, hd});
  Tensor k = parts[1].view({B, T, Hkv, hd});
  Tensor v = parts[2].view({B, T, Hkv, hd});
  if (config_.arch == Arch::Llama) {
    Tensor c = position_rows(rope_cos_, start, T), s = position_rows(rope_sin_, start, T);
    q = apply_rotary(q, c, s);
    k = apply_rotary(k, c, s);
  }
  q = q.permute({0, 2, 1, 3});
  k = k.permute({0, 2, 1, 3});
  v = v.permute({0, 2, 1, 3});
  if (cache) {
    // Generation runs without autograd: write the new positions, attend over the prefix.
    copy_into(cache->k[layer].narrow(2, start, T), k);
    copy_into(cache->v[layer].narrow(2, start, T), v);
    k = cache->k[layer].narrow(2, 0, start + T);
    v = cache->v[layer].narrow(2, 0, start + T);
  }
  // Causal with Tq <= Tk aligns the last query with the last key: a decode step (Tq = 1) sees
  // every cached position.
  // Under context parallelism the layout's attention sees the whole sequence (generation,
  // with its cache, never runs context parallel).
  Tensor y = parallel_ && !cache ? parallel_->attention(q, k, v, /*causal=*/true)
                                 : scaled_dot_product_attention(q, k, v, Tensor(), true);
  y = y.permute({0, 2, 1, 3}).reshape({B, T, H * hd});
  Tensor r =
      add(x, maybe_dropout(row(y, l.attn_proj_w, l.attn_proj_b, sp, std::nullopt, li + 1), sp));

  // The MLP's activation is recomputed in backward, not kept (Note [Recomputed MLP activation]),
  // except under recompute none, which keeps act(h) for c_proj's weight gradient.
  // llama's c_fc output is [B, T, 2ff]: the gate columns, then the up columns.
  Tensor hn = norm(r, l.ln_2_w, l.ln_2_b, sp);
  if (l.moe_index >= 0) {
    Tensor m = moe_branch(l, hn, fuse_act, aux);
    // The loss term reads the unit's parameters in backward too (ZeRO-3: Note [GPT parameter
    // units]), so it passes through the unit's release as well.
    if (aux && aux->loss.defined()) aux->loss = done_units({unit}, aux->loss);
    return done_units({unit}, add(r, maybe_dropout(m, sp)));
  }
  const bool gpt2 = config_.arch == Arch::GPT2;
  Tensor h = column(hn, l.c_fc_w, gpt2 ? l.c_fc_b : Tensor(), sp, li + 2);
  const MlpActivation act = gpt2 ? MlpActivation::GeluTanh : MlpActivation::SwiGLU;
  Tensor m =
      fuse_act ? row(h, l.mlp_proj_w, l.mlp_proj_b, sp, act, li + 3)
               : row(mlp_activation(h, act), l.mlp_proj_w, l.mlp_proj_b, sp, std::nullopt, li + 3);
  return done_units({unit}, add(r, maybe_dropout(m, sp)));
}

void GPT::set_recompute(RecomputeOptions r) {
  TD_CHECK(r.num_layers == -1 || r.mode == Recompute::Full, "GPT.set_recompute: num_layers (",
           r.num_layers,
           ") applies to recompute 'full' only, "
           "got '",
           recompute_name(r.mode), "'");
  TD_CHECK(r.num_layers == -1 || (r.num_layers >= 1 && r.num_layers <= stage_.num_layers),
           "GPT.set_recompute: num_layers ", r.num_layers, " must be in [1, ", stage_.num_layers,
           "]: this stage holds ", stage_.num_layers, " layers (h.", stage_.first_layer, "..h.",
           stage_.first_layer + stage_.num_layers - 1, ")");
  recompute_ = r;
}

Recompute GPT::block_mode(size_t layer) const {
  if (recompute_.mode != Recompute::Full) return recompute_.mode;
  const bool all = recompute_.num_layers < 0;
  return all || static_cast<int64_t>(layer) < recompute_.num_layers ? Recompute::Full
                                                                    : Recompute::Selective;
}

// The block's parameters are leaves (or, under mixed precision, cast inside the block), so the
// recomputed graph is self-contained, as autograd::checkpoint requires. The model must outlive
// the backward (the node calls back into it). An MoE block returns its loss term as a second
// output; only the first run (the forward) counts its statistics, the recomputation in backward
// routes the same tokens again.
Tensor GPT::recomputed_block(size_t layer, const Tensor& x, int64_t start, bool sp, BlockAux* aux) {
  autograd::CheckpointOptions opts;
  opts.generators.push_back(&dropout_gen_);
  if (parallel_) opts.generators.push_back(&parallel_->split_generator());
  auto first = std::make_shared<bool>(true);
  auto fn = [this, layer, start, sp, first](const TensorList& in) {
    BlockAux a;
    a.record = *first;
    *first = false;
    Tensor y = block(layers_[layer], in[0], start, nullptr, layer, sp, true, &a);
    return a.loss.defined() ? TensorList{y, a.loss} : TensorList{y};
  };
  TensorList out = autograd::checkpoint(fn, {x}, opts);
  if (out.size() > 1) aux->loss = out[1];
  return out[0];
}

void GPT::set_expert_parallel(int64_t rank, int64_t size, MoEExpertDispatch dispatch) {
  const int64_t E = config_.num_experts;
  TD_CHECK(E > 0, "GPT.set_expert_parallel: the model has no experts (num_experts=0)");
  TD_CHECK(size >= 1 && rank >= 0 && rank < size, "GPT.set_expert_parallel: rank ", rank, " of ",
           size, " is not a valid expert-parallel position");
  TD_CHECK(E % size == 0, "GPT.set_expert_parallel: num_experts ", E,
           " is not divisible by the expert-parallel size ", size);
  TD_CHECK(ep_size_ == 1, "GPT.set_expert_parallel: expert parallelism (ep=", ep_size_,
           ") is already installed; build a new model to lay it out again");
  TD_CHECK(units_ == nullptr,
           "GPT.set_expert_parallel: install expert parallelism before the "
           "parameters are sharded (ZeRO-3)");
  TD_CHECK(dispatch != nullptr || size == 1, "GPT.set_expert_parallel: no dispatch for ep ", size);
  const int64_t El = E / size;
  autograd::NoGradGuard ng;
  for (auto& [name, slot] : slots()) {
    if (name.find(".mlp.experts.") == std::string::npos) continue;
    replace_parameter(name, slot, slot->narrow(0, rank * El, El).contiguous().clone());
  }
  ep_rank_ = rank;
  ep_size_ = size;
  ep_dispatch_ = std::move(dispatch);
}

Tensor GPT::moe_branch(const Layer& l, const Tensor& hn, bool fuse_act, BlockAux* aux) {
  MoEOptions o = MoEOptions::from_config(config_, is_training(), fuse_act);
  o.dispatch = ep_dispatch_;
  // The router runs in fp32 on the fp32 master weight, or on ZeRO-3's gathered compute-dtype
  // copy when only that holds values.
  const auto cast_to = [this](const Tensor& p, DType dt) -> Tensor {
    if (!p.defined() || dt == config_.dtype) return cast(p);
    if (units_) {
      if (auto c = units_->compute_param(p, config_.dtype)) return to_dtype(*c, dt);
    }
    return p.dtype() == dt ? p : to_dtype(p, dt);
  };
  MoEForward f = moe_mlp(hn, l.moe, o, cast_to);
  if (o.training && (aux == nullptr || aux->record)) {
    const auto k = static_cast<size_t>(l.moe_index);
    moe_stats_.layers[k].add(f);
    for (size_t e = 0; e < f.routed_per_expert.size(); ++e)
      moe_load_[k][e] += f.routed_per_expert[e];
  }
  if (aux) aux->loss = f.loss;
  return f.y;
}

void GPT::reset_moe_stats() {
  const auto E = static_cast<size_t>(config_.num_experts);
  for (auto& s : moe_stats_.layers) {
    MoELayerStats fresh;
    fresh.layer = s.layer;
    fresh.tokens_per_expert.assign(E, 0);
    s = std::move(fresh);
  }
  moe_load_.assign(moe_stats_.layers.size(), std::vector<int64_t>(E, 0));
}

// Note [MoE router bias]: the loads are counted per training forward (all micro-batches of a
// step) and consumed here; the bias steers only which experts are chosen, never the gate weights
// (Note [MoE routing] in ops/moe_router.h), so it needs no gradient. It is a buffer: saved in
// checkpoints with the parameters, moved with the model.
void GPT::update_moe_router_bias() {
  for (auto& l : layers_) {
    if (l.moe_index < 0) continue;
    auto& load = moe_load_[static_cast<size_t>(l.moe_index)];
    moe_update_expert_bias(l.moe.expert_bias, load, config_.moe_router_bias_update_rate);
    std::fill(load.begin(), load.end(), 0);
  }
}

// Note [MoE losses of a pipeline stage]: a stage without the head cannot add its MoE layers'
// loss terms to the loss, so it keeps their sum for the pipeline runtime, which backpropagates
// it together with the stage's output (backward([h, terms], [dh, seed])), the seed being the
// one the last stage's loss gets (1/m times the loss scale). The gradients then equal those of
// the whole model's loss, terms included. A term not taken before the next forward of the stage
// would be lost silently: that forward refuses to run. Evaluation (eval mode or no grad) drops
// the terms.
void GPT::keep_stage_moe_loss(const char* op) {
  TD_CHECK(!stage_moe_loss_.defined(), op,
           ": the MoE loss terms of this pipeline stage's previous ",
           "forward were not taken (take_moe_loss(); they must be backpropagated with the "
           "stage's output)");
  if (moe_losses_.empty()) return;
  if (!is_training() || !autograd::grad_enabled()) {
    moe_losses_.clear();  // evaluation: nothing is backpropagated
    return;
  }
  Tensor sum = moe_losses_[0];
  for (size_t i = 1; i < moe_losses_.size(); ++i) sum = add(sum, moe_losses_[i]);
  moe_losses_.clear();
  stage_moe_loss_ = sum;
}

Tensor GPT::take_moe_loss() {
  Tensor t = stage_moe_loss_;
  stage_moe_loss_ = Tensor();
  return t;
}

Tensor GPT::with_moe_losses(const Tensor& loss) {
  Tensor out = loss;
  for (const Tensor& t : moe_losses_) out = add(out, t);
  moe_losses_.clear();
  return out;
}

// Under context parallelism this rank's tokens sit at its zigzag positions (Note [Zigzag
// layout] in parallel/context_parallel.h): the rows of a position table (wpe, RoPE) there.
Tensor GPT::position_rows(const Tensor& table, int64_t start, int64_t T) const {
  if (!parallel_ || parallel_->cp_size() == 1) return table.narrow(0, start, T);
  return index_select(table, 0,
                      from_vector<int64_t>(parallel_->positions(T), {T}).to(table.device()));
}

Tensor GPT::hidden(const Tensor& input, int64_t start, KVCache* cache, bool sp) {
  Tensor x = input;
  // The rotary tables are no parameters or buffers (Module::to does not move them): they
  // follow the activations' device on first use there.
  if (rope_cos_.defined() && rope_cos_.device() != x.device()) {
    rope_cos_ = rope_cos_.to(x.device());
    rope_sin_ = rope_sin_.to(x.device());
  }
  if (stage_.pre) {
    const Tensor& idx = input;
    const int64_t T = idx.size(1);
    use_unit(0);
    use_unit(1);
    // Embeddings are gathered from the fp32 tables and the [B, T, d] result is cast: fewer
    // bytes than casting the tables, and the scatter-add of their gradient stays fp32.
    x = parallel_ ? parallel_->embedding(idx, wte_, sp) : embedding(wte_, idx);
    if (config_.arch == Arch::GPT2) {
      Tensor pos = position_rows(wpe_, start, T);
      if (sp) {
        // This rank holds tokens [rank*n, (rank+1)*n): its rows of the position table. The
        // all-reduce of replicated() runs over all T rows, the same on every rank.
        const int64_t n = T / parallel_->tp_size();
        pos = parallel_->replicated(pos).narrow(0, parallel_->tp_rank() * n, n);
      }
      x = add(x, pos);
    }
    x = done_units({0, 1}, maybe_dropout(cast(x), sp));
  }
  moe_losses_.clear();
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Recompute mode = block_mode(i);
    BlockAux aux;
    if (mode == Recompute::Full && cache == nullptr) {
      x = recomputed_block(i, x, start, sp, &aux);
    } else {
      x = block(layers_[i], x, start, cache, i, sp, mode != Recompute::None, &aux);
    }
    if (aux.loss.defined()) moe_losses_.push_back(aux.loss);
  }
  if (stage_.post) use_unit(2 + static_cast<int64_t>(layers_.size()));  // ln_f; head() ends it
  return stage_.post ? norm(x, ln_f_w_, ln_f_b_, sp) : x;
}

Tensor GPT::head(const Tensor& h, const Tensor& targets, bool sp) {
  const auto compute = [&]() -> Tensor {
    if (parallel_) {
      if (!targets.defined()) return parallel_->logits(h, cast(lm_head_), config_.vocab_size, sp);
      return parallel_->loss(h, cast(lm_head_), targets, config_.vocab_size, kIgnoreIndex, sp);
    }
    if (!targets.defined()) return linear(h, cast(lm_head_));  // logits [B, T, V]
    // Training: the head and the loss fused and chunked over tokens, so the [B*T, V] logits and
    // their gradient never exist whole (Note [Chunked LM head]). The softmax over the vocabulary
    // is taken in fp32 (a bf16 scalar loss would be rounded to 8 bits of mantissa).
    const int64_t N = h.size(0) * h.size(1);
    return linear_cross_entropy(h.reshape({N, h.size(2)}), cast(lm_head_), targets.reshape({N}),
                                kIgnoreIndex);
  };
  // Note [GPT parameter units]: the head unit (ln_f, begun in hidden()) and the tied table's.
  const int64_t u = 2 + static_cast<int64_t>(layers_.size());
  const bool tied = config_.arch == Arch::GPT2;
  use_unit(u);
  if (tied) use_unit(0);
  return tied ? done_units({u, 0}, compute()) : done_units({u}, compute());
}

Tensor GPT::forward_stage(const Tensor& input, const Tensor& targets) {
  TD_CHECK(input.defined(), "GPT.forward_stage: the input is undefined");
  const bool sp = parallel_ && parallel_->sequence_parallel();
  if (stage_.pre) return forward(input, targets);
  const int64_t tp = parallel_ ? parallel_->tp_size() : 1;
  TD_CHECK(input.dim() == 3 && input.size(2) == config_.d_model && input.dtype() == config_.dtype,
           "GPT.forward_stage: a stage after the first takes hidden states [batch, seq",
           sp ? "/tp" : "", ", ", config_.d_model, "] ", dtype_name(config_.dtype), ", got ",
           describe(input));
  const int64_t cp = parallel_ ? parallel_->cp_size() : 1;
  TD_CHECK(input.size(1) * (sp ? tp : 1) * cp <= config_.block_size,
           "GPT.forward_stage: sequence length exceeds block_size ", config_.block_size);
  if (targets.defined()) {
    TD_CHECK(is_integral(targets.dtype()) && targets.dim() == 2 &&
                 targets.size(0) == input.size(0) &&
                 targets.size(1) == input.size(1) * (sp ? tp : 1),
             "GPT.forward_stage: targets must be [batch, seq] int64/int32 ids matching the hidden "
             "states ",
             describe(input), ", got ", describe(targets));
  }
  Tensor h = hidden(input, 0, nullptr, sp);
  if (!stage_.post) {
    keep_stage_moe_loss("GPT.forward_stage");
    return h;
  }
  return targets.defined() ? with_moe_losses(head(h, targets, sp)) : head(h, targets, sp);
}

Tensor GPT::forward(const Tensor& idx, const Tensor& targets) {
  TD_CHECK(idx.defined(), "GPT.forward: idx is undefined");
  TD_CHECK(stage_.pre,
           "GPT.forward: this model is a pipeline stage without the embeddings "
           "(layers from ",
           stage_.first_layer, "): call forward_stage with hidden states");
  TD_CHECK(idx.dim() == 2 && is_integral(idx.dtype()),
           "GPT.forward: idx must be [batch, seq] int64/int32 token ids, got ", describe(idx));
  const int64_t B = idx.size(0), T = idx.size(1);
  TD_CHECK(B > 0 && T > 0, "GPT.forward: empty input ", describe(idx));
  const int64_t cp = parallel_ ? parallel_->cp_size() : 1;
  TD_CHECK(T * cp <= config_.block_size, "GPT.forward: sequence length ", T * cp,
           cp > 1 ? " (this rank's tokens x cp)" : "", " exceeds block_size ", config_.block_size);
  if (targets.defined()) {
    TD_CHECK(is_integral(targets.dtype()) && targets.sizes() == idx.sizes(),
             "GPT.forward: targets must be int64/int32 with the shape of idx ",
             shape_str(idx.sizes()), ", got ", describe(targets));
  }
  const bool sp = parallel_ && parallel_->sequence_parallel();
  TD_CHECK(!sp || T % parallel_->tp_size() == 0, "GPT.forward: sequence parallelism splits the ", T,
           " positions over ", parallel_->tp_size(),
           " tensor-parallel ranks: the sequence length must be divisible by tp");
  Tensor h = hidden(idx, 0, nullptr, sp);  // [B, T(/tp under sp), d], compute dtype
  if (!stage_.post) {
    keep_stage_moe_loss("GPT.forward");
    return h;
  }
  if (!targets.defined()) {
    moe_losses_.clear();  // logits only: nothing to add the terms to
    return head(h, targets, sp);
  }
  return with_moe_losses(head(h, targets, sp));
}

Tensor GPT::generate(const Tensor& idx, int64_t max_new_tokens, double temperature, int64_t top_k,
                     Generator* gen) {
  TD_CHECK(stage_.whole(config_.n_layer), "GPT.generate: this model is one pipeline stage (layers ",
           stage_.first_layer, "..", stage_.first_layer + stage_.num_layers - 1,
           "); generate from the whole model (e.g. loaded from the checkpoint)");
  TD_CHECK(!parallel_ || parallel_->cp_size() == 1,
           "GPT.generate: the model is laid out context parallel (cp=", parallel_->cp_size(),
           "); generate from a model without cp (e.g. loaded from the checkpoint)");
  TD_CHECK(idx.defined() && idx.dim() == 2 && is_integral(idx.dtype()),
           "GPT.generate: idx must be [batch, seq] int64/int32 token ids, got ",
           idx.defined() ? describe(idx) : std::string("undefined"));
  const int64_t B = idx.size(0), T0 = idx.size(1), V = config_.vocab_size;
  const int64_t block = config_.block_size;
  TD_CHECK(B > 0 && T0 > 0, "GPT.generate: empty prompt ", describe(idx));
  TD_CHECK(max_new_tokens >= 0, "GPT.generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  TD_CHECK(units_ == nullptr,
           "GPT.generate: the parameters are sharded (ZeRO-3); generate from "
           "a model loaded from the checkpoint");
  autograd::NoGradGuard ng;
  TrainingFlagGuard eval_mode(*this);
  Generator& g = gen ? *gen : default_generator();

  std::vector<std::vector<int64_t>> seq(static_cast<size_t>(B));
  {
    std::vector<int64_t> flat = to_vector<int64_t>(idx);
    for (int64_t b = 0; b < B; ++b)
      seq[b].assign(flat.begin() + b * T0, flat.begin() + (b + 1) * T0);
  }
  KVCache cache;
  const int64_t Hkv = config_.kv_heads() / (parallel_ ? parallel_->tp_size() : 1);
  const int64_t hd = config_.head_dim();
  const Device dev = lm_head_.device();  // the model's device; sampling runs on the host
  for (size_t i = 0; i < layers_.size(); ++i) {
    cache.k.push_back(Tensor::empty({B, Hkv, block, hd}, config_.dtype, dev));
    cache.v.push_back(Tensor::empty({B, Hkv, block, hd}, config_.dtype, dev));
  }
  Tensor head = cast(lm_head_);
  int64_t len = 0;  // positions held by the cache
  // Runs `n` tokens per row (the last n of each sequence) at positions [start, start + n) and
  // returns the fp32 logits of the last one, [B, V].
  auto step = [&](int64_t n, int64_t start) {
    std::vector<int64_t> ids;
    ids.reserve(static_cast<size_t>(B * n));
    for (const auto& s : seq) ids.insert(ids.end(), s.end() - n, s.end());
    Tensor h = hidden(from_vector<int64_t>(ids, {B, n}).to(dev), start, &cache, /*sp=*/false);
    Tensor last = h.narrow(1, n - 1, 1);
    Tensor logits = parallel_ ? parallel_->logits(last, head, V, false) : linear(last, head);
    len = start + n;
    return to_vector<float>(logits);
  };
  std::vector<float> logits = step(std::min(T0, block), 0);
  std::vector<float> u(static_cast<size_t>(B));
  for (int64_t t = 0; t < max_new_tokens; ++t) {
    philox_uniform(g.reserve(B), u.data(), B);
    for (int64_t b = 0; b < B; ++b) {
      seq[b].push_back(sample_row(logits.data() + b * V, V, temperature, top_k, u[b]));
    }
    if (t + 1 == max_new_tokens) break;
    // Past block_size every absolute position shifts: recompute the cropped context.
    logits = len < block ? step(1, len) : step(block, 0);
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(B) * seq[0].size());
  for (const auto& s : seq) out.insert(out.end(), s.begin(), s.end());
  return from_vector<int64_t>(out, {B, static_cast<int64_t>(seq[0].size())}).to(idx.device());
}

std::vector<nn::NamedTensors> GPT::param_units() const {
  std::vector<nn::NamedTensors> units(3 + layers_.size());
  for (auto& [name, p] : named_parameters()) {
    if (name == "wte.weight") {
      units[0].emplace_back(name, p);
    } else if (name == "wpe.weight") {
      units[1].emplace_back(name, p);
    } else if (name.rfind("h.", 0) == 0) {
      const int64_t i = std::stoll(name.substr(2, name.find('.', 2) - 2)) - stage_.first_layer;
      units[2 + static_cast<size_t>(i)].emplace_back(name, p);
    } else {
      units.back().emplace_back(name, p);  // ln_f.*, lm_head.weight
    }
  }
  return units;
}

void GPT::set_param_units(std::shared_ptr<ParamUnits> u, int64_t first_unit) {
  TD_CHECK(units_ == nullptr, "GPT.set_param_units: parameter units are already installed");
  for (LinearPrecision p : linears_.precisions()) {
    TD_CHECK(p == LinearPrecision::Default || p == LinearPrecision::FP8,
             "GPT.set_param_units: block linears in ", precision_name(p),
             " need their fp32 weights, which ZeRO-3 parameter units release between uses");
  }
  units_ = std::move(u);
  first_unit_ = first_unit;
}

void GPT::use_unit(int64_t k) const {
  if (units_) units_->materialize(first_unit_ + k);
}

Tensor GPT::done_units(std::vector<int64_t> ks, const Tensor& y) const {
  if (!units_) return y;
  for (auto& k : ks) k += first_unit_;
  return units_->release(ks, y);
}

std::vector<ParamGroup> GPT::param_groups(double weight_decay) const {
  std::vector<ParamGroup> groups(2);
  groups[0].weight_decay = weight_decay;
  groups[1].weight_decay = 0.0;
  const auto is_bias = [](const std::string& n) {
    return n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
  };
  for (auto& [name, p] : named_parameters())
    groups[p.dim() >= 2 && !is_bias(name) ? 0 : 1].params.emplace_back(name, p);
  return groups;
}

}  // namespace td::models
