#pragma once
// The configuration shared by the fused GPT, its HF GPT-2 interop and (later) the parallel
// layouts and the training CLI.
#include <cstdint>
#include <string>

#include "tardelli/core/dtype.h"

namespace td::models {

enum class Arch { GPT2, Llama };
Arch parse_arch(const std::string& s);  // "gpt2" | "llama"
const char* arch_name(Arch a);

struct GPTConfig {
  Arch arch = Arch::GPT2;
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;  // max sequence length (learned positions / RoPE cache)
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_kv_head = 0;  // 0: = n_head (no grouping); llama may use fewer
  int64_t d_model = 768;
  int64_t ffn_hidden = 0;  // 0: 4*d_model (gpt2) or llama's rule (see gpt.h)
  double dropout = 0.0;
  double norm_eps = 1e-5;
  double rope_base = 10000.0;
  DType dtype = DType::Float32;  // compute dtype; parameters stay fp32 (master weights)
  uint64_t seed = 1337;          // initialization

  // Mixture of experts (models/moe_mlp.h). num_experts 0: every block has the dense MLP.
  int64_t num_experts = 0;
  int64_t moe_top_k = 2;                     // experts per token, in [1, num_experts]
  int64_t moe_ffn_hidden = 0;                // each expert's hidden size; 0: ffn_hidden_size()
  int64_t moe_layer_freq = 1;                // block i is MoE iff i % moe_layer_freq == 0
  int64_t moe_shared_experts = 0;            // always-on experts (one dense MLP of S * hidden)
  bool moe_norm_topk = true;                 // top_k > 1: gates divided by their sum
  double moe_aux_loss_coeff = 0.01;          // Switch/GShard load-balancing loss
  double moe_z_loss_coeff = 0.0;             // ST-MoE router z-loss
  double moe_router_bias_update_rate = 0.0;  // DeepSeek-V3 aux-loss-free bias; 0: off
  double moe_capacity_factor = 0.0;          // 0: dropless; else capacity per expert (training)

  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_dim() const { return d_model / n_head; }
  // Whether block i has a mixture-of-experts MLP (Megatron's pattern: blocks 0, F, 2F, ...).
  bool is_moe_layer(int64_t i) const { return num_experts > 0 && i % moe_layer_freq == 0; }
  // Validates every field with a clear message (heads dividing d_model, ...).
  void validate() const;
  // The MoE fields' part of validate() (ranges checked only when num_experts > 0).
  void validate_moe() const;
  // "field: a vs b" lines for every field that differs (checkpoint compatibility messages).
  std::string diff(const GPTConfig& other) const;
};

}  // namespace td::models
