#include "tardelli/models/gpt_config.h"

#include <cmath>
#include <sstream>

namespace td::models {

Arch parse_arch(const std::string& s) {
  if (s == "gpt2") return Arch::GPT2;
  if (s == "llama") return Arch::Llama;
  TD_ERROR("GPTConfig: unknown arch '", s, "' (expected 'gpt2' or 'llama')");
}

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::GPT2:
      return "gpt2";
    case Arch::Llama:
      return "llama";
  }
  TD_ERROR("GPTConfig: invalid arch value ", static_cast<int>(a));
}

void GPTConfig::validate() const {
  const char* p = "GPTConfig: ";
  TD_CHECK(arch == Arch::GPT2 || arch == Arch::Llama, p, "unknown arch value ",
           static_cast<int>(arch), " (expected gpt2 or llama)");
  TD_CHECK(vocab_size > 0, p, "vocab_size must be > 0, got ", vocab_size);
  TD_CHECK(block_size > 0, p, "block_size must be > 0, got ", block_size);
  TD_CHECK(n_layer > 0, p, "n_layer must be > 0, got ", n_layer);
  TD_CHECK(d_model > 0, p, "d_model must be > 0, got ", d_model);
  TD_CHECK(n_head > 0, p, "n_head must be > 0, got ", n_head);
  TD_CHECK(d_model % n_head == 0, p, "n_head (", n_head, ") must divide d_model (", d_model, ")");
  TD_CHECK(n_kv_head >= 0, p, "n_kv_head must be >= 0 (0: = n_head), got ", n_kv_head);
  TD_CHECK(n_head % kv_heads() == 0, p, "n_kv_head (", kv_heads(), ") must divide n_head (", n_head,
           ")");
  TD_CHECK(arch != Arch::GPT2 || kv_heads() == n_head, p,
           "gpt2 has no grouped-query attention: n_kv_head must be 0 or n_head (", n_head,
           "), got ", n_kv_head);
  TD_CHECK(arch != Arch::Llama || head_dim() % 2 == 0, p,
           "llama's rotary embedding needs an even head_dim, got d_model/n_head = ", d_model, "/",
           n_head, " = ", head_dim());
  TD_CHECK(ffn_hidden >= 0, p, "ffn_hidden must be >= 0 (0: the arch's default), got ", ffn_hidden);
  TD_CHECK(dropout >= 0.0 && dropout < 1.0, p, "dropout must be in [0, 1), got ", dropout);
  TD_CHECK(norm_eps > 0.0 && std::isfinite(norm_eps), p, "norm_eps must be > 0, got ", norm_eps);
  TD_CHECK(rope_base > 0.0 && std::isfinite(rope_base), p, "rope_base must be > 0, got ",
           rope_base);
  TD_CHECK(is_floating(dtype), p, "dtype must be float32, bfloat16 or float16, got ",
           dtype_name(dtype));
  validate_moe();
}

void GPTConfig::validate_moe() const {
  const char* p = "GPTConfig: ";
  TD_CHECK(num_experts >= 0, p, "num_experts must be >= 0 (0: dense MLPs), got ", num_experts);
  if (num_experts == 0) return;
  TD_CHECK(moe_top_k >= 1 && moe_top_k <= num_experts, p,
           "moe_top_k must be in [1, num_experts = ", num_experts, "], got moe_top_k ", moe_top_k);
  TD_CHECK(moe_ffn_hidden >= 0, p, "moe_ffn_hidden must be >= 0 (0: the dense MLP's size), got ",
           moe_ffn_hidden);
  TD_CHECK(moe_layer_freq >= 1, p, "moe_layer_freq must be >= 1, got ", moe_layer_freq);
  TD_CHECK(moe_shared_experts >= 0, p, "moe_shared_experts must be >= 0, got ", moe_shared_experts);
  const auto non_negative = [&](const char* name, double v) {
    TD_CHECK(v >= 0.0 && std::isfinite(v), p, name, " must be a finite value >= 0, got ", v);
  };
  non_negative("moe_aux_loss_coeff", moe_aux_loss_coeff);
  non_negative("moe_z_loss_coeff", moe_z_loss_coeff);
  non_negative("moe_router_bias_update_rate", moe_router_bias_update_rate);
  non_negative("moe_capacity_factor", moe_capacity_factor);
}

std::string GPTConfig::diff(const GPTConfig& o) const {
  std::ostringstream os;
  auto field = [&](const char* name, const auto& a, const auto& b) {
    if (!(a == b)) os << name << ": " << a << " vs " << b << "\n";
  };
  if (arch != o.arch) os << "arch: " << arch_name(arch) << " vs " << arch_name(o.arch) << "\n";
  field("vocab_size", vocab_size, o.vocab_size);
  field("block_size", block_size, o.block_size);
  field("n_layer", n_layer, o.n_layer);
  field("n_head", n_head, o.n_head);
  field("n_kv_head", n_kv_head, o.n_kv_head);
  field("d_model", d_model, o.d_model);
  field("ffn_hidden", ffn_hidden, o.ffn_hidden);
  field("dropout", dropout, o.dropout);
  field("norm_eps", norm_eps, o.norm_eps);
  field("rope_base", rope_base, o.rope_base);
  if (dtype != o.dtype)
    os << "dtype: " << dtype_name(dtype) << " vs " << dtype_name(o.dtype) << "\n";
  field("seed", seed, o.seed);
  field("num_experts", num_experts, o.num_experts);
  field("moe_top_k", moe_top_k, o.moe_top_k);
  field("moe_ffn_hidden", moe_ffn_hidden, o.moe_ffn_hidden);
  field("moe_layer_freq", moe_layer_freq, o.moe_layer_freq);
  field("moe_shared_experts", moe_shared_experts, o.moe_shared_experts);
  field("moe_norm_topk", moe_norm_topk, o.moe_norm_topk);
  field("moe_aux_loss_coeff", moe_aux_loss_coeff, o.moe_aux_loss_coeff);
  field("moe_z_loss_coeff", moe_z_loss_coeff, o.moe_z_loss_coeff);
  field("moe_router_bias_update_rate", moe_router_bias_update_rate, o.moe_router_bias_update_rate);
  field("moe_capacity_factor", moe_capacity_factor, o.moe_capacity_factor);
  return os.str();
}

}  // namespace td::models
