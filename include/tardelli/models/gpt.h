#pragma once
// The fused GPT: one model, two architectures chosen by GPTConfig::arch, written plainly (no
// parallelism; a separate step lays it out over devices later).
//
//   gpt2:  x = wte[idx] + wpe[pos]; per layer x += attn(ln_1(x)); x += mlp(ln_2(x)) with
//          LayerNorm (weight+bias), GELU-tanh MLP [4d], biases everywhere; logits = ln_f(x) wte^T
//          (lm_head is the SAME tensor as wte: tied).
//   llama: x = wte[idx]; RMSNorm (weight only), RoPE on q and k, SwiGLU MLP, no biases,
//          grouped-query attention (n_kv_head divides n_head), untied lm_head.
//
// Parameter names (shared with the HF interop and the parallel layouts): wte.weight [V,d],
// wpe.weight [block,d] (gpt2), h.{i}.ln_1.weight (+bias), h.{i}.attn.c_attn.weight
// [(H+2*Hkv)*hd, d] (q rows, then k, then v; +bias), h.{i}.attn.c_proj.weight [d, H*hd] (+bias),
// h.{i}.ln_2.weight (+bias), h.{i}.mlp.c_fc.weight ([4d,d] gpt2; [2*ff,d] llama: gate rows then
// up rows; +bias gpt2), h.{i}.mlp.c_proj.weight [d, ff] (+bias), ln_f.weight (+bias),
// lm_head.weight [V,d] (gpt2: tied to wte.weight, listed once by named_parameters()).
//
// Mixture of experts (config.num_experts > 0): the blocks config.is_moe_layer(i) replace the
// dense mlp.* parameters by the MoE MLP's (models/moe_mlp.h): h.{i}.mlp.router.weight [E,d],
// h.{i}.mlp.experts.c_fc.weight [E, ff | 2ff, d], h.{i}.mlp.experts.c_proj.weight [E, d, ff]
// (+ biases [E, ...] gpt2), h.{i}.mlp.shared.* with shared experts, and the buffer
// h.{i}.mlp.router.expert_bias [E]. A training forward's loss is then the cross-entropy plus, per
// MoE layer, moe_aux_loss_coeff * aux + moe_z_loss_coeff * z (Note [MoE training mode]).
//
// Llama's hidden size when config.ffn_hidden is 0: ff = round_up(int(2 * 4d / 3), 64)
// (e.g. d=256 -> 704, d=4096 -> 10944; Llama-1 7B rounds to 256 and has 11008: set ffn_hidden
// to match a published checkpoint). gpt2's is 4d.
//
// Initialization (GPT-2's): every matrix and embedding ~ N(0, 0.02), the residual projections
// attn.c_proj and mlp.c_proj ~ N(0, 0.02/sqrt(2*n_layer)), biases 0, norm weights 1. Each
// parameter is drawn from its own Philox subsequence Generator(seed).split(fnv1a(name)), so its
// values depend only on (seed, full name, shape): never on creation order or on any later layout.
//
// Mixed precision (config.dtype bf16/f16): parameters stay fp32 (master weights, fp32 gradients);
// forward casts each weight with the differentiable td::to_dtype and runs the activations in the
// compute dtype; the loss is computed in fp32 from the compute-dtype logits.
//
// Dropout (config.dropout > 0, training mode): on the embeddings and on both residual branches
// (nanoGPT's resid_dropout). The fused attention kernel has no probability dropout, so attention
// weights are not dropped.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tardelli/core/allocator.h"
#include "tardelli/core/rng.h"
#include "tardelli/models/block_linears.h"
#include "tardelli/models/gpt_config.h"
#include "tardelli/models/gpt_parallelism.h"
#include "tardelli/models/moe_mlp.h"
#include "tardelli/models/param_units.h"
#include "tardelli/models/recompute.h"
#include "tardelli/nn/module.h"
#include "tardelli/nn/shard_spec.h"
#include "tardelli/ops/fp8.h"

namespace td::models {

// Targets equal to this are ignored by the loss (torch's default for cross_entropy).
inline constexpr int64_t kIgnoreIndex = -100;

// The hidden size of the MLP for a config (rule above).
int64_t ffn_hidden_size(const GPTConfig& config);

// Which part of the model one pipeline stage (or model chunk) holds: layers
// [first_layer, first_layer + num_layers) under their global names h.{i}, the embeddings when
// `pre`, and ln_f + the head when `post`. The default is the whole model.
//
// Note [Stage parameters]: every parameter is drawn from its own named stream (Note [Init
// streams]), so a stage holds exactly the values the whole model would. A gpt2 stage with `post`
// but not `pre` holds its own copy of wte.weight (the tied head, same name and values); the
// pipeline keeps the copies equal by summing their gradients between the first and last stage.
struct GPTStage {
  int64_t first_layer = 0;
  int64_t num_layers = -1;  // -1: every layer from first_layer on
  bool pre = true;
  bool post = true;
  bool whole(int64_t n_layer) const {
    return first_layer == 0 && (num_layers < 0 || num_layers == n_layer) && pre && post;
  }
};

struct ParamGroup {
  nn::NamedTensors params;
  double weight_decay = 0.0;
};

class GPT : public nn::Module {
 public:
  // Validates the config and initializes every parameter from config.seed. Use make_shared
  // (module traversal needs shared_from_this).
  explicit GPT(GPTConfig config, GPTStage stage = {});

  const GPTConfig& config() const { return config_; }
  const GPTStage& stage() const { return stage_; }

  // One pipeline stage's part of a training forward: `input` is idx [B, T] token ids on a
  // `pre` stage, else the previous stage's hidden states [B, T(/tp under sequence
  // parallelism), d] in the compute dtype. On a `post` stage with targets: the mean loss; a
  // `post` stage without targets: the logits; otherwise the hidden states to send on (targets
  // unused). The
  // whole model's forward(idx, targets) is forward_stage(idx, targets).
  Tensor forward_stage(const Tensor& input, const Tensor& targets = Tensor());
  // A training forward of a stage without the head keeps its MoE layers' loss terms (summed, an
  // fp32 scalar) for the caller to backpropagate with the stage's output; this returns them and
  // forgets them (undefined when there are none). Note [MoE losses of a pipeline stage].
  Tensor take_moe_loss();

  // idx: [B, T] int64/int32 token ids, T <= block_size. With targets ([B, T] ids, kIgnoreIndex
  // to skip a position): the mean cross-entropy, an fp32 scalar. Without: logits [B, T, V] in
  // the compute dtype. On a pipeline stage with the embeddings but not the head: the hidden
  // states (targets unused). td::Error on a stage without the embeddings (forward_stage).
  Tensor forward(const Tensor& idx, const Tensor& targets = Tensor());

  // Autoregressive sampling with a KV cache: the prompt is run once (prefill), then one token per
  // step attends to the cached keys/values. Each step samples from softmax(logits / temperature)
  // restricted to the top_k largest logits (top_k <= 0: all); temperature <= 0 or top_k == 1 is
  // greedy (argmax, first maximum on ties). Once the context would exceed block_size the context
  // is cropped to the last block_size tokens (as nanoGPT) and recomputed, since absolute
  // positions shift. Returns [B, T0 + max_new_tokens] int64. Runs without autograd, in eval
  // semantics (no dropout), and leaves the training flag unchanged.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature = 1.0,
                  int64_t top_k = 0, Generator* gen = nullptr);

  // AdamW's two groups: decay = every parameter with dim >= 2 (matrices, embeddings) except
  // biases (the experts' [E, out] biases are 2-D), no decay = the rest (biases, norm weights).
  // Each parameter appears once (tied weights included).
  std::vector<ParamGroup> param_groups(double weight_decay) const;

  // Mixture of experts (Note [MoE training mode] in moe_mlp.h). The statistics of this stage's
  // MoE layers summed over the training forwards since the last reset_moe_stats() (empty layers
  // for a dense model): per-expert token counts, dropped slots, the unscaled aux and z losses.
  const MoEStats& moe_stats() const { return moe_stats_; }
  void reset_moe_stats();
  // The aux-loss-free balancing step (DeepSeek-V3): for every MoE layer of this stage,
  // router.expert_bias[e] += moe_router_bias_update_rate * sign(mean load - load[e]) with the
  // loads counted by the training forwards since the previous call, which are then cleared. Call
  // it after each optimizer step; a no-op when the rate is 0 or nothing was routed.
  void update_moe_router_bias();
  // Those pending loads: [MoE layer of this stage][expert] token-slots. Mutable so that a
  // data-parallel trainer can sum them over its ranks before update_moe_router_bias(), which
  // keeps the replicas' biases equal.
  std::vector<std::vector<int64_t>>& moe_router_load() { return moe_load_; }
  // Expert parallelism (parallel/expert_parallel.h: apply_expert_parallel installs it): keeps
  // only experts [rank E/size, (rank+1) E/size) of every MoE layer (the stacked experts.*
  // weights sliced along dim 0; full_shape() still gives the whole tensors) and runs the experts
  // through `dispatch` (Note [Expert dispatch]). Before ZeRO-3 sharding; once per model.
  void set_expert_parallel(int64_t rank, int64_t size, MoEExpertDispatch dispatch);
  int64_t ep_size() const { return ep_size_; }
  int64_t ep_rank() const { return ep_rank_; }

  // The stream dropout draws from (seeded from config.seed). Part of the training state: a
  // checkpoint saves its (seed, offset, subsequence) so a resumed run drops the same units.
  Generator& dropout_generator() { return dropout_gen_; }
  const Generator& dropout_generator() const { return dropout_gen_; }

  // Lays the model out as `p` says (Note [GPT tensor-parallel layout] in gpt_parallelism.h):
  // every parameter is replaced by this rank's shard of the full one (shard_spec(name)), the
  // full tensors are released, and forward/generate run the layout's collectives. Call it once,
  // on a freshly built model, before creating an optimizer (optimizers hold the old tensors).
  // td::Error naming the config field when the layout does not fit (heads, kv heads or hidden
  // units not divisible by tp), or when a layout is already installed.
  void set_parallelism(std::shared_ptr<GPTParallelism> p);
  GPTParallelism* parallelism() const { return parallel_.get(); }

  // What each block keeps for backward (Note [Recompute modes] in recompute.h). Values and
  // gradients do not depend on it; it is not part of the config or of checkpoints. td::Error
  // when num_layers is given for a mode other than full, or exceeds this stage's layers.
  void set_recompute(RecomputeOptions r);
  // FP8 training, emulated (ops/fp8.h, docs/fp8.md): the attention and dense MLP linears of
  // every block run through fp8_linear with delayed scaling (amax history `history`, `margin`;
  // 0: current scaling), gradients in E5M2 (hybrid) or E4M3 (e4m3); MoE experts, the embeddings
  // and the head stay in the compute dtype. Works under tensor (+ sequence) parallel layouts
  // and on pipeline stages: a tp shard's amaxes are reduced over tp (current scaling inside
  // the layer, delayed at the commit); context parallelism is untested (the trainer refuses it).
  // Training forwards note their amaxes (Note [Deferred amax] in ops/fp8.h); the scalings
  // advance when the caller commits them once per step: commit_fp8() on one rank, or
  // parallel::sync_fp8_amaxes over the ranks holding these layers (identical scales everywhere).
  void set_fp8(int64_t history, double margin, Fp8Recipe recipe = Fp8Recipe::Hybrid);
  bool fp8() const { return linears_.fp8(); }
  // The scaling states, four per block (c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) in block
  // order (linear_names()), each with input, weight and grad scalings (checkpoints save them).
  std::vector<Fp8LinearState>& fp8_states() { return linears_.fp8_states(); }
  void commit_fp8() { linears_.commit_fp8(); }
  // The names of this stage's block linears, in the order of fp8_states() (h.{i}.attn.c_attn,
  // h.{i}.attn.c_proj, h.{i}.mlp.c_fc, h.{i}.mlp.c_proj for each of its layers h.{i}).
  std::vector<std::string> linear_names() const;
  // Each block linear's precision, statistics and FP8 state (Note [Linear precision] in
  // models/precision_policy.h). fp32 linears and the statistics are refused under ZeRO-3
  // parameter units (td::Error at the forward: their fp32 weight holds no values between uses).
  BlockLinears& block_linears() { return linears_; }
  const BlockLinears& block_linears() const { return linears_; }
  const RecomputeOptions& recompute() const { return recompute_; }
  // Where this rank's tensor `name` (a parameter name) lies in the full one under the
  // installed layout (replicated without one). td::Error for an unknown name.
  nn::ShardSpec shard_spec(const std::string& name) const;
  // The full (logical) shape of parameter `name` (the vocabulary tables unpadded).
  Shape full_shape(const std::string& name) const;

  // Note [GPT parameter units]: the parameters in the groups a sharding layer materializes
  // together (models/param_units.h), in forward order: unit 0 wte.weight, unit 1 wpe.weight,
  // unit 2 + i this model's i-th block (all of h.{first_layer + i}.*), unit 2 + num_layers the
  // head (ln_f, and llama's untied lm_head). Units a stage or architecture lacks are empty.
  // The tied gpt2 head uses unit 0 again. wte is a unit of its own so that a pipeline's copy
  // of it on the last stage is laid out like the first stage's.
  std::vector<nn::NamedTensors> param_units() const;
  // Installs `u`: forward calls u->materialize(first_unit + k) / u->release(...) around unit k.
  // generate() is then unavailable (it keeps the head across calls).
  void set_param_units(std::shared_ptr<ParamUnits> u, int64_t first_unit = 0);

 private:
  struct Layer {
    Tensor ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
    Tensor ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
    int64_t moe_index = -1;  // its place among this stage's MoE layers; -1: a dense MLP
    MoEParams moe;
  };
  // A block's MoE side output: its loss term (undefined for none), and whether this run of the
  // block counts its statistics (not when a checkpointed block is recomputed in backward).
  struct BlockAux {
    Tensor loss;
    bool record = true;
  };
  struct KVCache {
    std::vector<Tensor> k, v;  // per layer [B, Hkv, block_size, hd], compute dtype
  };

  // The hidden states after ln_f for tokens at positions [start, start + T); with a cache the
  // new keys/values are written into it at those positions and attention runs over its prefix.
  // sp: this forward runs sequence parallel (the result is then this rank's chunk of T).
  // `input`: idx on a pre stage, hidden states otherwise; ln_f is applied on a post stage.
  Tensor hidden(const Tensor& input, int64_t start, KVCache* cache, bool sp);
  Tensor head(const Tensor& h, const Tensor& targets, bool sp);
  // `fuse_act`: the MLP activation is recomputed in backward (activation_linear) rather than kept.
  Tensor block(const Layer& l, const Tensor& x, int64_t start, KVCache* cache, size_t layer,
               bool sp, bool fuse_act = true, BlockAux* aux = nullptr);
  // block() under autograd::checkpoint: only x is kept; the block runs again in backward with
  // the dropout streams replayed (Note [Recompute modes]).
  Tensor recomputed_block(size_t layer, const Tensor& x, int64_t start, bool sp, BlockAux* aux);
  // The MoE MLP branch of block l for its normed input hn.
  Tensor moe_branch(const Layer& l, const Tensor& hn, bool fuse_act, BlockAux* aux);
  // loss + the MoE loss terms of the last hidden() (which are then dropped).
  Tensor with_moe_losses(const Tensor& loss);
  // A stage without the head: moe_losses_ summed into stage_moe_loss_.
  void keep_stage_moe_loss(const char* op);
  Recompute block_mode(size_t layer) const;
  Tensor norm(const Tensor& x, const Tensor& w, const Tensor& b, bool sp) const;
  Tensor cast(const Tensor& p) const;  // parameter -> compute dtype (differentiable)
  // Rows [start, start + T) of a position table, or this rank's positions under cp.
  Tensor position_rows(const Tensor& table, int64_t start, int64_t T) const;
  Tensor maybe_dropout(const Tensor& x, bool sp);
  // The layout-dependent linear layers (plain linear without a layout). li: the block linear's
  // index (linear_names()), whose GEMM block_linears() gives.
  Tensor column(const Tensor& x, const Tensor& w, const Tensor& b, bool sp, size_t li) const;
  Tensor row(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
             std::optional<MlpActivation> act, size_t li) const;
  LinearFn block_gemm(size_t li, const Tensor& w, const Tensor& b, bool row) const;
  // Every parameter slot with its full name (the tied gpt2 head excluded).
  std::vector<std::pair<std::string, Tensor*>> slots();
  // Makes `value` (a new leaf) the parameter `name` held in `slot` (a layout step's shard).
  void replace_parameter(const std::string& name, Tensor* slot, Tensor value);

  GPTConfig config_;
  GPTStage stage_;
  int64_t ff_ = 0;
  Tensor wte_, wpe_, ln_f_w_, ln_f_b_, lm_head_;
  std::vector<Layer> layers_;
  Tensor rope_cos_, rope_sin_;  // llama: fp32 [block_size, hd/2]
  Generator dropout_gen_;
  void use_unit(int64_t k) const;  // Note [GPT parameter units]
  Tensor done_units(std::vector<int64_t> ks, const Tensor& y) const;

  std::shared_ptr<GPTParallelism> parallel_;  // null: one device
  RecomputeOptions recompute_;
  mutable BlockLinears linears_;       // four per block: FP8 states, precisions, statistics
  std::shared_ptr<ParamUnits> units_;  // null: parameters always full
  int64_t first_unit_ = 0;
  std::map<std::string, Shape> full_shapes_;  // every parameter name (tied head included)
  MoEStats moe_stats_;
  int64_t ep_rank_ = 0, ep_size_ = 1;  // expert parallelism (set_expert_parallel)
  MoEExpertDispatch ep_dispatch_;
  std::vector<std::vector<int64_t>> moe_load_;  // Note [MoE router bias]
  std::vector<Tensor> moe_losses_;              // the MoE loss terms of the running forward
  Tensor stage_moe_loss_;                       // a headless stage's terms until take_moe_loss()
};

}  // namespace td::models
