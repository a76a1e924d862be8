#pragma once
// Per-layer precision of the GPT's block linears (issue 27): a static map from linear names to
// precisions, and the adaptive policy that moves each linear up and down the ladder
// fp8 -> bf16 -> fp32 from its monitored statistics.
//
// Note [Linear precision]: a block linear (h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.mlp.c_fc,
// h.{i}.mlp.c_proj) runs its GEMM with operands in one of
//   fp8   the emulated FP8 GEMM (ops/fp8.h): E4M3 input and weight, E5M2 (or E4M3) gradient;
//   bf16  input, weight and bias rounded to bf16 (fp32 accumulation), output in the compute dtype;
//   fp32  the input in fp32 and the fp32 master weight, output in the compute dtype;
// or, "default", the model's compute dtype as without any policy (fp8 under --fp8). The
// activations between the linears and every other op are not affected.
//
// Note [Adaptive precision]: each linear starts at its floor (the lowest allowed precision: fp8
// with FP8 enabled, else bf16, or a map entry's) and, once per training step, after its
// statistics have been reduced over every rank holding the linear (sums of counts, maxima of
// errors: exact in any order, so every rank takes the same decision):
//   - fp8 is promoted to bf16 when the fraction of its FP8-quantized values (input, weight,
//     gradient) that saturate exceeds `fp8_overflow`, or that flush to zero exceeds
//     `fp8_underflow`, or when its output's relative error against the fp32 GEMM exceeds
//     `fp8_error`;
//   - bf16 is promoted to fp32 when its output's relative error against the fp32 GEMM exceeds
//     `bf16_error` or its output holds inf/NaN;
//   - a promoted linear is demoted one step after `stable_steps` consecutive steps in which the
//     lower precision's statistics, measured in the shadow (the FP8 counts with the scales that
//     keep being recorded, the error of an FP8 or bf16 GEMM of the same operands), stayed
//     within half its promotion thresholds. A promotion or a demotion restarts the count.
// Statistics of a step with no measurement (all zero) neither promote nor count as stable; FP8
// statistics are gathered once delayed scaling has committed an amax (before, it quantizes
// with the initial scale 1, which says nothing about the format).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tardelli/ops/fp8.h"

namespace td::models {

enum class LinearPrecision : uint8_t { Default, FP8, BF16, FP32 };
const char* precision_name(LinearPrecision p);  // "default", "fp8", "bf16", "fp32"
// "fp8" | "bf16" | "fp32" (a map's values); td::Error naming `what` otherwise.
LinearPrecision parse_precision(const std::string& name, const std::string& what);

// The four block linears of layers [first, first + n), in the model's order: per layer
// h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.mlp.c_fc, h.{i}.mlp.c_proj.
std::vector<std::string> block_linear_names(int64_t first_layer, int64_t num_layers);

// A precision map's entries (name -> precision) checked against a model of n_layer blocks. Names
// are the linears' (h.3.mlp.c_fc) or the aliases blocks.{i}.{qkv, attn_out, mlp_in, mlp_out};
// the result uses the linears' names. td::Error naming the entry for an unknown linear or
// precision.
std::map<std::string, LinearPrecision> parse_precision_map(
    const std::map<std::string, std::string>& entries, int64_t n_layer);

// One linear's statistics over a step (Note [Adaptive precision]).
struct LinearStats {
  Fp8Counts fp8;            // its FP8-quantized (or shadow-quantized) tensors
  double fp8_error = 0.0;   // max relative error of the FP8 GEMM's output vs fp32 (0: none)
  double bf16_error = 0.0;  // max relative error of the bf16 GEMM's output vs fp32 (0: none)
  int64_t nonfinite = 0;    // non-finite output values
  void merge(const LinearStats& o);
};

struct PrecisionPolicyOptions {
  double fp8_overflow = 1e-2;
  double fp8_underflow = 0.05;
  double fp8_error = 0.25;
  double bf16_error = 0.02;
  int64_t stable_steps = 100;
};

// One decision of a step: linear `name` moved from `from` to `to`.
struct PrecisionChange {
  std::string name;
  LinearPrecision from, to;
};

// The adaptive policy over a list of linears (one model chunk's). A value: no model, no
// communicator; the caller feeds it the reduced statistics (parallel/precision_sync.h) and
// applies precisions() to the model.
class PrecisionPolicy {
 public:
  // `floors`: each linear's lowest allowed precision (fp8, bf16 or fp32), one per name.
  PrecisionPolicy(std::vector<std::string> names, std::vector<LinearPrecision> floors,
                  PrecisionPolicyOptions options = {});

  // One step's decisions from the step's statistics (one per linear, reduced over ranks).
  std::vector<PrecisionChange> update(const std::vector<LinearStats>& stats);

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<LinearPrecision>& precisions() const { return precision_; }
  const std::vector<LinearPrecision>& floors() const { return floor_; }
  const PrecisionPolicyOptions& options() const { return options_; }

  // The state a checkpoint keeps, per linear: precision and stable-step count.
  const std::vector<int64_t>& stable_counts() const { return stable_; }
  // Restores linear `name`'s state; td::Error for an unknown name or a precision below its floor.
  void set_state(const std::string& name, LinearPrecision precision, int64_t stable);

 private:
  std::vector<std::string> names_;
  std::vector<LinearPrecision> floor_, precision_;
  std::vector<int64_t> stable_;
  PrecisionPolicyOptions options_;
};

}  // namespace td::models
