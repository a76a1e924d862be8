#pragma once
#include <optional>

// td::models::GPTParallelism: the few places where the GPT's computation depends on how it is
// laid out over devices, as an interface the model calls. The model itself is written once,
// without parallelism (gpt.h); a separate step (td::parallel::parallelize, parallel/
// parallelize.h) builds an implementation from a process grid and installs it with
// GPT::set_parallelism, which also replaces every parameter by this rank's shard. The model
// layer never sees a communicator: this interface is all it knows of distribution.
//
// Note [GPT tensor-parallel layout] (Megatron-LM's, on the GPT's [B, T, d] activations):
//   - c_attn (fused QKV) and mlp.c_fc are column-parallel: each rank computes its heads
//     (n_head/tp query heads, n_kv_head/tp key/value heads) and its 1/tp of the MLP hidden units;
//     attention and the MLP nonlinearity run on those locally.
//   - attn.c_proj and mlp.c_proj are row-parallel: partial products are summed over tp (their
//     biases are replicated and added once, after the sum).
//   - wte (and llama's untied lm_head) are vocab-parallel: rows split over tp after padding the
//     vocabulary; the embedding is a masked lookup + sum, the loss a vocab-parallel
//     cross-entropy, so the full [tokens, vocab] logits never exist.
//   - Norm weights, wpe and the row-parallel biases are replicated.
// Sequence parallelism (sp) additionally splits the activations between the layers (the
// residual stream, norms, dropout) along T (dim 1): the column-parallel input is all-gathered
// over tp and the row-parallel output reduce-scattered, so those activations take 1/tp of the
// memory. A replicated parameter that acts on split activations then gets only a partial
// gradient on each rank; replicated() completes it (an all-reduce in backward).
#include <cstdint>
#include <functional>
#include <vector>

#include "tardelli/core/rng.h"
#include "tardelli/core/tensor.h"
#include "tardelli/ops/activation_linear.h"
#include "tardelli/ops/attention.h"

namespace td::models {

// A block linear's GEMM on this rank's operands, y = x w^T + b (Note [Linear precision] in
// gpt.h); empty: td::linear. The same type as parallel::LocalLinear.
using LinearFn = std::function<Tensor(const Tensor& x, const Tensor& w, const Tensor& b)>;

class GPTParallelism {
 public:
  virtual ~GPTParallelism() = default;

  virtual int tp_size() const = 0;
  virtual int tp_rank() const = 0;
  // Whether training forwards run sequence parallel (generation never does: its steps have
  // one token).
  virtual bool sequence_parallel() const = 0;
  // The vocabulary the vocab-parallel tables are padded to (a multiple of tp_size()).
  virtual int64_t padded_vocab(int64_t vocab_size) const = 0;

  // x [B, T(/tp under sp), in] -> [B, T, out/tp]: this rank's output columns, computed by
  // `gemm` (empty: linear) on the gathered input.
  virtual Tensor column_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                               const LinearFn& gemm) = 0;
  // x [B, T, in/tp] -> [B, T(/tp under sp), out]: summed over tp, + the replicated bias. With
  // `act` the layer's input is act(x), recomputed in backward (activation_linear) when `gemm`
  // is empty; `gemm` computes the partial product (its bias argument undefined).
  virtual Tensor row_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool sp,
                            std::optional<MlpActivation> act, const LinearFn& gemm) = 0;
  // The max of `v` over the tensor-parallel group (the amax of a tensor split over tp, Note
  // [Amax reduction] in parallel/precision_sync.h); v itself without tp.
  virtual double tp_max(double v) = 0;
  // ids [B, T] (replicated) -> [B, T(/tp under sp), d] from the vocab-parallel table w.
  virtual Tensor embedding(const Tensor& ids, const Tensor& w, bool sp) = 0;
  // A replicated tensor consumed by split activations: identity forward, gradient all-reduced
  // over tp in backward.
  virtual Tensor replicated(const Tensor& p) = 0;
  // The mean cross-entropy of logits = h w^T (w vocab-parallel [V_pad/tp, d]) against targets
  // [B, T] (replicated; ignore_index skipped), never gathering the logits. fp32 scalar.
  virtual Tensor loss(const Tensor& h, const Tensor& w, const Tensor& targets, int64_t vocab_size,
                      int64_t ignore_index, bool sp) = 0;
  // The full logits [B, T, vocab_size] of h (gathered; inference and evaluation of logits).
  virtual Tensor logits(const Tensor& h, const Tensor& w, int64_t vocab_size, bool sp) = 0;
  // The dropout stream for split activations (different on every tp rank; Note [Which stream]
  // in parallel/rng_tracker.h). Replicated activations use the model's dropout_generator().
  virtual Generator& split_generator() = 0;

  // Context parallelism (Note [Zigzag layout] in parallel/context_parallel.h): a training
  // forward's tokens are this rank's zigzag part of a sequence split over cp_size() ranks.
  // Everything but attention, the positions and the loss runs on them unchanged; loss() then
  // returns the mean over the cp group (Note [Context-parallel loss] in parallel/parallelize.h).
  virtual int cp_size() const { return 1; }
  virtual int cp_rank() const { return 0; }
  // The max of `v` over the cp group (the amax of an activation split over the sequence, for
  // FP8 current scaling); v itself without cp.
  virtual double cp_max(double v) { return v; }
  // The global positions of this rank's `local_T` tokens (empty without cp).
  virtual std::vector<int64_t> positions(int64_t /*local_T*/) const { return {}; }
  // Attention q [B, H, T, hd], k/v [B, Hkv, T, hd] over the whole sequence of the cp group.
  virtual Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
    return scaled_dot_product_attention(q, k, v, Tensor(), causal);
  }
};

}  // namespace td::models
