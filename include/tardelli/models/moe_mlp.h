#pragma once
// The mixture-of-experts MLP of the fused GPT (models/gpt.h), written plainly for one device:
//
//   routing   = moe_route(x, router.weight, K, router.expert_bias)   (ops/moe_router.h)
//   rows      = moe_permute(x, dispatch)                              (ops/moe_dispatch.h)
//   expert(r) = c_proj_e(act(c_fc_e(r)))  for the rows r of expert e  (ops/grouped_linear.h)
//   y         = moe_unpermute(expert rows, gates) + shared(x)
//
// act is the dense MLP's of the arch: GELU-tanh with biases (gpt2), SwiGLU without (llama). The
// shared experts (moe_shared_experts S > 0) are one dense MLP of hidden size S * H that every
// token goes through (DeepSeek's shared experts, fused as Megatron does).
//
// Parameters, under "h.{i}.mlp." (E experts, hidden size H, F = H for gpt2, 2H for llama: gate
// rows then up rows): router.weight [E, d], experts.c_fc.weight [E, F, d] (+ bias [E, H] gpt2),
// experts.c_proj.weight [E, d, H] (+ bias [E, d] gpt2), shared.c_fc.weight [S*F, d],
// shared.c_proj.weight [d, S*H] (+ biases gpt2), and the buffer router.expert_bias [E] (fp32,
// not trained, saved in checkpoints). The expert weights are stacked along dim 0, the dim an
// expert-parallel layout splits.
//
// Note [MoE training mode]: the capacity, the balancing losses and the statistics apply to
// training forwards only (GPT::is_training()). Evaluation and generation route every token to
// its K experts (dropless) and their loss is the cross-entropy alone, comparable with a dense
// model's.
//
// Host round trips: the top-k choice and the dispatch plan are computed on a host copy of the
// router probabilities (ops/moe_router.h, ops/moe_dispatch.h), and a training forward reads its
// two loss values back for the statistics: one synchronization per MoE layer on a GPU. Device
// kernels for top-k and the dispatch can replace them behind the same ops.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tardelli/core/tensor.h"
#include "tardelli/models/gpt_config.h"
#include "tardelli/nn/module.h"
#include "tardelli/ops/activation_linear.h"

namespace td::models {

// One MoE MLP's parameters (fp32 masters) and its expert-bias buffer.
struct MoEParams {
  Tensor router_w, expert_bias;
  Tensor fc_w, fc_b, proj_w, proj_b;                              // experts
  Tensor shared_fc_w, shared_fc_b, shared_proj_w, shared_proj_b;  // undefined when S = 0
  // The parameters (not the buffer) by their names under "h.{i}.mlp.", undefined ones skipped.
  std::vector<std::pair<std::string, Tensor*>> slots();
};

// Draws a parameter's initial values from its full name (Note [Init streams] in gpt.cpp).
using MoEInitFn = std::function<Tensor(const std::string& name, const Shape& shape, double std)>;

// The hidden size of each expert: moe_ffn_hidden, or the dense MLP's when 0.
int64_t moe_hidden_size(const GPTConfig& config);

// Registers block `i`'s MoE MLP as block.mlp (module names above) and initializes it like the
// dense MLP: router and c_fc weights ~ N(0, std_w), c_proj weights ~ N(0, std_proj), biases and
// the expert bias 0.
MoEParams register_moe_mlp(nn::Module& block, int64_t i, const GPTConfig& config, double std_w,
                           double std_proj, const MoEInitFn& normal);

// Note [Expert dispatch]: what runs the experts on the permuted rows (grouped by expert, in
// expert order, rows_per_expert[e] rows for expert e of all num_experts). `local` computes the
// experts whose weights this device holds, on rows grouped by those experts (group_sizes, one
// per local expert). Without a dispatch the device holds every expert and runs local directly;
// expert parallelism (parallel/expert_parallel.h) installs one that sends each expert's rows to
// the rank holding it and brings the results back in the same order.
using MoELocalExperts =
    std::function<Tensor(const Tensor& rows, const std::vector<int64_t>& group_sizes)>;
using MoEExpertDispatch = std::function<Tensor(
    const Tensor& rows, const std::vector<int64_t>& rows_per_expert, const MoELocalExperts& local)>;

struct MoEOptions {
  int64_t num_experts = 0, top_k = 1;  // num_experts: all of them (the router's outputs)
  MlpActivation act = MlpActivation::GeluTanh;
  bool norm_topk = true;
  double capacity_factor = 0.0;  // 0: dropless
  double aux_loss_coeff = 0.0, z_loss_coeff = 0.0;
  bool training = true;        // Note [MoE training mode]
  bool fuse_act = true;        // the activation recomputed in backward (activation_linear)
  MoEExpertDispatch dispatch;  // Note [Expert dispatch]; null: every expert is local
  static MoEOptions from_config(const GPTConfig& config, bool training, bool fuse_act);
};

// What one forward of the layer produced.
struct MoEForward {
  Tensor y;     // x's shape, compute dtype
  Tensor loss;  // fp32 scalar aux_loss_coeff * aux + z_loss_coeff * z (differentiable);
                // undefined when not training or both coefficients are 0
  // Training forwards only: the routed token-slots per expert (before the capacity), the tokens,
  // the dropped slots and the unscaled losses.
  std::vector<int64_t> routed_per_expert;
  int64_t tokens = 0, dropped = 0;
  double aux_loss = 0.0, z_loss = 0.0;
};

// Turns a parameter (or undefined) into its operand of a dtype: differentiable, and for the GPT
// aware of ZeRO-3's gathered copies.
using MoECastFn = std::function<Tensor(const Tensor& param, DType dtype)>;

// x [..., d] in the compute dtype. The router runs on cast(router_w, float32), the experts on
// their weights cast to x's dtype; the expert bias is read as it is.
MoEForward moe_mlp(const Tensor& x, const MoEParams& p, const MoEOptions& o, const MoECastFn& cast);

// Statistics of one MoE layer, summed over the training forwards since the last reset.
struct MoELayerStats {
  int64_t layer = 0;                       // the block index (h.{layer})
  int64_t forwards = 0;                    // training forwards counted
  int64_t tokens = 0;                      // tokens routed
  std::vector<int64_t> tokens_per_expert;  // token-slots routed to each expert (before capacity)
  int64_t dropped = 0;                     // token-slots dropped by the capacity
  double aux_loss = 0.0, z_loss = 0.0;     // unscaled, summed over forwards
  void add(const MoEForward& f);
  int64_t max_load() const;  // the busiest expert's token-slots
  double mean_load() const;  // token-slots per expert
};

struct MoEStats {
  std::vector<MoELayerStats> layers;  // one per MoE layer of the model (stage), in order
  // Means over layers and forwards (0 when nothing was counted).
  double aux_loss() const;
  double z_loss() const;
  int64_t dropped() const;  // summed over layers
  // max over layers of max_load / mean_load: 1 when perfectly balanced.
  double max_load_ratio() const;
};

}  // namespace td::models
