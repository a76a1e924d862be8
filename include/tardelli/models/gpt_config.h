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

  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_dim() const { return d_model / n_head; }
  // Validates every field with a clear message (heads dividing d_model, ...).
  void validate() const;
  // "field: a vs b" lines for every field that differs (checkpoint compatibility messages).
  std::string diff(const GPTConfig& other) const;
};

}  // namespace td::models
