#pragma once
// Hugging Face GPT-2 interop: read and write the directory that transformers'
// GPT2LMHeadModel.save_pretrained(dir, safe_serialization=True) produces (config.json +
// model.safetensors), mapped to the fused GPT's parameter names (models/gpt.h).
//
// Names: HF's are ours with a "transformer." prefix (GPT2LMHeadModel) or without it (GPT2Model);
// both are read. HF's Conv1D stores c_attn / attn.c_proj / mlp.c_fc / mlp.c_proj weights as
// [in, out]; ours are Linear [out, in], so those four are transposed on the way in and out.
// The attention buffers attn.bias / attn.masked_bias of older files are ignored. GPT-2 ties
// lm_head to wte: an lm_head.weight in the file must equal wte.weight bit for bit.
//
// Config: n_embd -> d_model, n_layer, n_head, n_positions (or n_ctx) -> block_size, vocab_size,
// layer_norm_epsilon -> norm_eps, n_inner (null: 4 * n_embd) -> ffn_hidden, resid_pdrop ->
// dropout (our one dropout rate; HF's embd_pdrop/attn_pdrop are not modelled: the fused attention
// has no probability dropout). Missing keys take GPT2Config's defaults, as transformers does.
// Anything whose math we do not implement is a clear error: activation_function other than
// gelu_new (or its identical twin gelu_pytorch_tanh), scale_attn_weights false,
// scale_attn_by_inverse_layer_idx, add_cross_attention, untied embeddings, model_type not gpt2.
//
// Round trip: load_hf_gpt2 -> save_hf_gpt2 reproduces every tensor bit for bit, and the
// safetensors file byte for byte when the source was written by transformers (same names, same
// order, same {"format": "pt"} metadata).
#include <memory>
#include <string>

#include "tardelli/core/json.h"
#include "tardelli/models/gpt.h"
#include "tardelli/models/gpt_config.h"
#include "tardelli/nn/module.h"

namespace td::models {

struct HFGPT2Checkpoint {
  GPTConfig config;  // arch gpt2, dtype float32, the default seed (HF configs carry none)
  // Our names and layout; "lm_head.weight" is the same tensor as "wte.weight" (as in
  // GPT::state_dict()), so GPT::load_state_dict(strict=true) accepts it as is.
  nn::StateDict state_dict;
};

// config.json <-> GPTConfig (`where` names the file in errors).
GPTConfig gpt_config_from_hf(const json::Value& hf, const std::string& where = "config.json");
// The GPT2Config transformers would write for `config` (keys sorted, as save_pretrained does);
// torch_dtype names the parameters' dtype. Only arch gpt2.
json::Value hf_config_from_gpt(const GPTConfig& config, DType torch_dtype = DType::Float32);

// Reads dir/config.json and dir/model.safetensors (or the shards listed in
// dir/model.safetensors.index.json). Tensors keep the file's dtype.
HFGPT2Checkpoint load_hf_gpt2(const std::string& dir);

// Writes dir/config.json and dir/model.safetensors with HF names ("transformer." prefix, Conv1D
// layout, no lm_head.weight: tied). `state_dict` must hold exactly the gpt2 parameters of
// `config` with their shapes (lm_head.weight optional; if present it must equal wte.weight).
// Atomic: a new dir is written as dir + ".tmp" and renamed into place; in an existing dir each
// file is written to file + ".tmp" and renamed (other files there, e.g. a tokenizer, are kept).
void save_hf_gpt2(const std::string& dir, const GPTConfig& config, const nn::StateDict& state_dict);
void save_hf_gpt2(const std::string& dir, const GPTConfig& config, const nn::NamedTensors& tensors);

// A fused GPT with the checkpoint's weights; `dtype` sets the compute dtype (parameters stay
// fp32 master weights, converted from the file's dtype).
std::shared_ptr<GPT> gpt_from_hf(const std::string& dir, DType dtype = DType::Float32);
// save_hf_gpt2(dir, model.config(), model.state_dict()): td::Error for arch llama.
void gpt_to_hf(const GPT& model, const std::string& dir);

}  // namespace td::models
