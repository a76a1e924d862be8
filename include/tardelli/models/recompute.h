#pragma once
// Activation recomputation for the fused GPT (Megatron's --recompute-granularity /
// --recompute-method block / --recompute-num-layers). A training-time choice of what each
// transformer block keeps between forward and backward: it never changes values, gradients,
// parameters or checkpoints, only memory and time.
//
// Note [Recompute modes]: per block and per token, with s = bytes of the compute dtype, d =
// d_model, A = n_head * head_dim (= d), K = n_kv_head * head_dim, ff = the MLP hidden size and
// H = n_head, the block keeps (fp32 statistics: 4 bytes each):
//
//   selective, gpt2:  s * (10 d + ff)              + 4 * (4 + H)
//   selective, llama: s * (6 d + 3 A + 3 K + 2 ff) + 4 * (2 + H)
//   none:             selective + s * ff (gpt2: the GELU output) or + s * 2 ff (llama: silu(gate)
//                     and silu(gate) * up)
//   full:             s * d (the block's input; nothing else until its backward recomputes it)
//
// What the d-sized terms are (gpt2; llama the same with RMSNorm and rotated q/k): the block
// input x (ln_1 and the residual add), ln_1's output (c_attn's input), the c_attn output
// [A + 2K] (q, k, v are views of it; llama adds its rotated q [A] and k [K]), the attention
// output [A] (the flash kernel's backward input and, as a view, c_proj's input: the kernel
// writes it in [B, T, H, hd] order), the attention branch [d] (the residual add keeps it),
// r = x + branch (ln_2 and the add), ln_2's output (c_fc's input), c_fc's output h [ff | 2 ff]
// (activation_linear's input) and the MLP branch [d]. The statistics: layer norm's mean and rstd
// (rms norm: rstd) for two norms, and the attention's log-sum-exp per head. Dropout keeps no mask
// (Note [Dropout mask]). The flash attention kernel never stores the [T, T] probabilities in any
// mode: Korthikanti et al.'s "attention core" recomputation is what it does always, so `selective`
// differs from `none` only by the MLP activation (Note [Recomputed MLP activation]).
// tests/models/test_recompute measures these formulas with the allocator. Under tensor parallelism
// A, K, ff and H are this rank's shares; under sequence parallelism the d-sized terms (except the
// gathered norm outputs) are this rank's T / tp tokens.
//
// Cost: `none` runs the activation once (no recomputation); `selective` runs it again in
// backward (one elementwise pass over [tokens, ff]); `full` runs each block's whole forward again
// in backward (about a third more compute per step: forward + backward ~ 3 forwards, now 4), its
// collectives included under tensor parallelism.
//
// Default: selective. Megatron's default is none, but here none buys nothing: the recomputed
// activation is bitwise the stored one (same kernel, same operands), costs one elementwise pass
// against the block's eight GEMMs, and selective is what this library has always run (its
// benchmarks and memory numbers are selective's). `none` exists to measure what selective saves.
//
// RNG replay (full): a recomputed block must drop the same units. Its forward records the states
// of every generator the block draws from (the model's dropout stream and, with a tensor-parallel
// layout, the layout's split stream used under sequence parallelism); the recomputation starts
// from those states and the generators are then put back where backward found them (Note
// [Checkpoint]). Losses and gradients are therefore bitwise those of `none`/`selective` in fp32.
#include <cstdint>
#include <string>

namespace td::models {

enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& s);  // "none" | "selective" | "full"
const char* recompute_name(Recompute r);

struct RecomputeOptions {
  Recompute mode = Recompute::Selective;
  // full only: recompute the first num_layers blocks of the stage (model chunk) and run the
  // rest as `selective` (Megatron's block method); -1: every block.
  int64_t num_layers = -1;
};

}  // namespace td::models
