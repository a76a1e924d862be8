#include "tardelli/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/activation.h"
#include "tardelli/ops/attention.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/dropout.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/embedding.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/loss.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/norm.h"
#include "tardelli/ops/rotary.h"
#include "tardelli/ops/view.h"

namespace td::models {

namespace {

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
GPT::GPT(GPTConfig config)
    : nn::Module("GPT"), config_(std::move(config)), dropout_gen_(config_.seed, 0xD409) {
  config_.validate();
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

  auto wte = child(*this, "wte", "Embedding");
  wte_ = wte->register_parameter("weight", normal("wte.weight", {V, d}, std_w));
  if (gpt2) {
    auto wpe = child(*this, "wpe", "Embedding");
    wpe_ = wpe->register_parameter("weight", normal("wpe.weight", {config_.block_size, d}, std_w));
  }
  auto h = child(*this, "h", "ModuleList");
  layers_.resize(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) {
    Layer& l = layers_[static_cast<size_t>(i)];
    const std::string pre = "h." + std::to_string(i) + ".";
    auto blk = child(*h, std::to_string(i), "Block");
    norm_mod(*blk, "ln_1", l.ln_1_w, l.ln_1_b);
    auto attn = child(*blk, "attn", "CausalSelfAttention");
    linear_mod(*attn, pre + "attn.", "c_attn", (H + 2 * Hkv) * hd, d, std_w, l.c_attn_w,
               l.c_attn_b);
    linear_mod(*attn, pre + "attn.", "c_proj", d, H * hd, std_proj, l.attn_proj_w, l.attn_proj_b);
    norm_mod(*blk, "ln_2", l.ln_2_w, l.ln_2_b);
    auto mlp = child(*blk, "mlp", "MLP");
    linear_mod(*mlp, pre + "mlp.", "c_fc", gpt2 ? ff_ : 2 * ff_, d, std_w, l.c_fc_w, l.c_fc_b);
    linear_mod(*mlp, pre + "mlp.", "c_proj", d, ff_, std_proj, l.mlp_proj_w, l.mlp_proj_b);
  }
  norm_mod(*this, "ln_f", ln_f_w_, ln_f_b_);
  auto head = child(*this, "lm_head", "Linear");
  // gpt2 ties the head to the token embedding: the same tensor, so named_parameters lists it
  // once (as wte.weight) and both uses accumulate into one gradient.
  lm_head_ =
      head->register_parameter("weight", gpt2 ? wte_ : normal("lm_head.weight", {V, d}, std_w));
  if (!gpt2) std::tie(rope_cos_, rope_sin_) = rope_cache(config_.block_size, hd, config_.rope_base);
}

Tensor GPT::cast(const Tensor& p) const {
  if (!p.defined() || p.dtype() == config_.dtype) return p;
  return to_dtype(p, config_.dtype);
}

Tensor GPT::norm(const Tensor& x, const Tensor& w, const Tensor& b) const {
  const int64_t d = config_.d_model;
  if (config_.arch == Arch::GPT2) return layer_norm(x, {d}, cast(w), cast(b), config_.norm_eps);
  return rms_norm(x, {d}, cast(w), config_.norm_eps);
}

Tensor GPT::maybe_dropout(const Tensor& x) {
  if (!is_training() || config_.dropout <= 0.0) return x;
  return dropout(x, config_.dropout, true, &dropout_gen_);
}

// Note [Fused QKV views]: q, k and v are column ranges of the one c_attn GEMM output
// [B, T, (H+2Hkv)*hd]; narrow + view + permute give [B, heads, T, hd] views of it with no copy
// (rotary reads its input through strides and writes the rotated q/k contiguously). Attention
// takes any strides, so the only copy in the block is the [B,H,T,hd] -> [B,T,H*hd] relayout of
// its output before c_proj.
Tensor GPT::block(const Layer& l, const Tensor& x, int64_t start, KVCache* cache, size_t layer) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t H = config_.n_head, Hkv = config_.kv_heads(), hd = config_.head_dim();
  Tensor qkv = linear(norm(x, l.ln_1_w, l.ln_1_b), cast(l.c_attn_w), cast(l.c_attn_b));
  Tensor q = qkv.narrow(2, 0, H * hd).view({B, T, H, hd});
  Tensor k = qkv.narrow(2, H * hd, Hkv * hd).view({B, T, Hkv, hd});
  Tensor v = qkv.narrow(2, (H + Hkv) * hd, Hkv * hd).view({B, T, Hkv, hd});
  if (config_.arch == Arch::Llama) {
    Tensor c = rope_cos_.narrow(0, start, T), s = rope_sin_.narrow(0, start, T);
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
  Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), /*is_causal=*/true);
  y = y.permute({0, 2, 1, 3}).reshape({B, T, H * hd});
  Tensor r = add(x, maybe_dropout(linear(y, cast(l.attn_proj_w), cast(l.attn_proj_b))));

  Tensor hn = norm(r, l.ln_2_w, l.ln_2_b);
  Tensor m;
  if (config_.arch == Arch::GPT2) {
    m = gelu(linear(hn, cast(l.c_fc_w), cast(l.c_fc_b)), GeluApprox::Tanh);
  } else {
    Tensor gu = linear(hn, cast(l.c_fc_w));  // [B, T, 2ff]: gate columns, then up columns
    m = mul(silu(gu.narrow(2, 0, ff_)), gu.narrow(2, ff_, ff_));
  }
  return add(r, maybe_dropout(linear(m, cast(l.mlp_proj_w), cast(l.mlp_proj_b))));
}

Tensor GPT::hidden(const Tensor& idx, int64_t start, KVCache* cache) {
  const int64_t T = idx.size(1);
  // Embeddings are gathered from the fp32 tables and the [B, T, d] result is cast: fewer bytes
  // than casting the tables, and the scatter-add of their gradient stays fp32.
  Tensor x = embedding(wte_, idx);
  if (config_.arch == Arch::GPT2) x = add(x, wpe_.narrow(0, start, T));
  x = maybe_dropout(cast(x));
  for (size_t i = 0; i < layers_.size(); ++i) x = block(layers_[i], x, start, cache, i);
  return norm(x, ln_f_w_, ln_f_b_);
}

Tensor GPT::forward(const Tensor& idx, const Tensor& targets) {
  TD_CHECK(idx.defined(), "GPT.forward: idx is undefined");
  TD_CHECK(idx.dim() == 2 && is_integral(idx.dtype()),
           "GPT.forward: idx must be [batch, seq] int64/int32 token ids, got ", describe(idx));
  const int64_t B = idx.size(0), T = idx.size(1);
  TD_CHECK(B > 0 && T > 0, "GPT.forward: empty input ", describe(idx));
  TD_CHECK(T <= config_.block_size, "GPT.forward: sequence length ", T, " exceeds block_size ",
           config_.block_size);
  if (targets.defined()) {
    TD_CHECK(is_integral(targets.dtype()) && targets.sizes() == idx.sizes(),
             "GPT.forward: targets must be int64/int32 with the shape of idx ",
             shape_str(idx.sizes()), ", got ", describe(targets));
  }
  Tensor h = hidden(idx, 0, nullptr);  // [B, T, d], compute dtype
  if (!targets.defined()) return linear(h, cast(lm_head_));  // logits [B, T, V]
  // Training: the head and the loss fused and chunked over tokens, so the [B*T, V] logits and
  // their gradient never exist whole (Note [Chunked LM head]). The softmax over the vocabulary
  // is taken in fp32 (a bf16 scalar loss would be rounded to 8 bits of mantissa).
  const int64_t N = h.size(0) * h.size(1);
  return linear_cross_entropy(h.reshape({N, h.size(2)}), cast(lm_head_), targets.reshape({N}),
                              kIgnoreIndex);
}

Tensor GPT::generate(const Tensor& idx, int64_t max_new_tokens, double temperature, int64_t top_k,
                     Generator* gen) {
  TD_CHECK(idx.defined() && idx.dim() == 2 && is_integral(idx.dtype()),
           "GPT.generate: idx must be [batch, seq] int64/int32 token ids, got ",
           idx.defined() ? describe(idx) : std::string("undefined"));
  const int64_t B = idx.size(0), T0 = idx.size(1), V = config_.vocab_size;
  const int64_t block = config_.block_size;
  TD_CHECK(B > 0 && T0 > 0, "GPT.generate: empty prompt ", describe(idx));
  TD_CHECK(max_new_tokens >= 0, "GPT.generate: max_new_tokens must be >= 0, got ", max_new_tokens);
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
  const int64_t Hkv = config_.kv_heads(), hd = config_.head_dim();
  for (size_t i = 0; i < layers_.size(); ++i) {
    cache.k.push_back(Tensor::empty({B, Hkv, block, hd}, config_.dtype));
    cache.v.push_back(Tensor::empty({B, Hkv, block, hd}, config_.dtype));
  }
  Tensor head = cast(lm_head_);
  int64_t len = 0;  // positions held by the cache
  // Runs `n` tokens per row (the last n of each sequence) at positions [start, start + n) and
  // returns the fp32 logits of the last one, [B, V].
  auto step = [&](int64_t n, int64_t start) {
    std::vector<int64_t> ids;
    ids.reserve(static_cast<size_t>(B * n));
    for (const auto& s : seq) ids.insert(ids.end(), s.end() - n, s.end());
    Tensor h = hidden(from_vector<int64_t>(ids, {B, n}), start, &cache);
    Tensor logits = linear(h.narrow(1, n - 1, 1), head);
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
  return from_vector<int64_t>(out, {B, static_cast<int64_t>(seq[0].size())});
}

std::vector<ParamGroup> GPT::param_groups(double weight_decay) const {
  std::vector<ParamGroup> groups(2);
  groups[0].weight_decay = weight_decay;
  groups[1].weight_decay = 0.0;
  for (auto& [name, p] : named_parameters())
    groups[p.dim() >= 2 ? 0 : 1].params.emplace_back(name, p);
  return groups;
}

}  // namespace td::models
