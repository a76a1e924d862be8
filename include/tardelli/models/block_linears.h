#pragma once
// td::models::BlockLinears: how a GPT's block linears (four per block: c_attn, attn.c_proj,
// mlp.c_fc, mlp.c_proj) compute their GEMMs: their FP8 scaling states (--fp8), their
// precisions (Note [Linear precision] in precision_policy.h) and, for the adaptive policy, the
// statistics each one gathers during a step. The GPT owns one and asks it for each linear's
// GEMM; the GEMM runs inside whatever layout the GPT has (one device, tensor parallel), which
// gives it this rank's operands.
#include <cstdint>
#include <vector>

#include "tardelli/models/gpt_parallelism.h"
#include "tardelli/models/precision_policy.h"
#include "tardelli/ops/fp8.h"

namespace td::models {

class BlockLinears {
 public:
  explicit BlockLinears(size_t count = 0) : count_(count) {}

  size_t size() const { return count_; }
  // FP8 scalings for every linear (history 0: current scaling). Until precisions are set, every
  // linear runs in FP8.
  void set_fp8(int64_t history, double margin, Fp8Recipe recipe);
  bool fp8() const { return !fp8_.empty(); }
  Fp8Recipe fp8_recipe() const { return recipe_; }
  std::vector<Fp8LinearState>& fp8_states() { return fp8_; }
  // Every pending amax committed as it is (one rank: Note [Deferred amax] in ops/fp8.h).
  void commit_fp8();

  // Per linear (size() entries; empty: all Default). FP8 needs set_fp8 first (td::Error).
  void set_precisions(std::vector<LinearPrecision> p);
  const std::vector<LinearPrecision>& precisions() const { return precision_; }
  // What linear i runs in: its precision, where Default means fp8 with FP8 on.
  LinearPrecision precision(size_t i) const;

  // Whether training forwards gather statistics (the adaptive policy's).
  void set_monitor(bool on);
  bool monitor() const { return monitor_; }
  // This step's statistics, one per linear (Note [Adaptive precision]).
  const std::vector<LinearStats>& stats() const { return stats_; }
  void reset_stats();

  // The GEMM of linear i on this rank's operands (x, its weight and bias in the compute dtype),
  // or an empty function when it is the plain linear. `w` and `b` are the fp32 master
  // parameters (fp32 precision and the reference of the statistics use them). `amaxes`: Observe
  // for a training forward, Ignore otherwise (statistics are gathered with Observe only).
  // `shards`: which operands are tp shards (Fp8Shards). The function refers to this object,
  // which must outlive the backward pass.
  LinearFn gemm(size_t i, const Tensor& w, const Tensor& b, Fp8Amax amaxes,
                const Fp8Shards& shards);

 private:
  size_t count_ = 0;
  Fp8Recipe recipe_ = Fp8Recipe::Hybrid;
  std::vector<Fp8LinearState> fp8_;
  std::vector<LinearPrecision> precision_;
  bool monitor_ = false;
  std::vector<LinearStats> stats_;
};

}  // namespace td::models
