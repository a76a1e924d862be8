#pragma once
// Named random streams for tensor-parallel training (Megatron-core's CudaRNGStatesTracker and
// model_parallel_cuda_manual_seed, tensor_parallel/random.py), without the global state: the
// tracker is a value the model owns, and callers pass the stream to the op that draws
// (dropout(x, p, training, tracker.fork(kModelParallelRng))).
//
// Note [Which stream]: activations that are REPLICATED over tp (after a row-parallel layer: the
// residual stream, embedding dropout) must get the same dropout mask on every tp rank, or the
// replicas diverge: they draw from kDefaultRng, seeded identically on all tp ranks. Activations
// that are SPLIT over tp (attention probabilities of this rank's heads, a column-parallel
// output) must get independent masks per rank, or the logical model would repeat one mask in
// every shard: they draw from kModelParallelRng, seeded seed + 2718 + tp_rank as in Megatron.
// (Megatron also offsets the whole seed by 100 * pp_rank; that is the caller's choice of seed.)
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/core/rng.h"

namespace td::parallel {

inline constexpr const char* kDefaultRng = "default";
inline constexpr const char* kModelParallelRng = "model-parallel-rng";
inline constexpr uint64_t kModelParallelSeedOffset = 2718;

class RngTracker {
 public:
  RngTracker() = default;

  // Megatron's model_parallel_cuda_manual_seed: kDefaultRng from `seed` and kModelParallelRng
  // from seed + 2718 + tp_rank (td::Error if tp_rank < 0).
  static RngTracker model_parallel(uint64_t seed, int tp_rank);

  // Adds a stream at offset 0. td::Error if the name exists or another stream already uses the
  // same (seed, subsequence): two names on one stream would draw correlated numbers.
  void add(const std::string& name, uint64_t seed, uint64_t subsequence = 0);
  bool has(const std::string& name) const;
  // The stream `name`; td::Error listing the known names when absent.
  Generator& get(const std::string& name);
  const Generator& get(const std::string& name) const;
  // The pointer the drawing ops take (dropout, rand, randn): &get(name).
  Generator* fork(const std::string& name) { return &get(name); }
  std::vector<std::string> names() const;  // sorted
  void reset();                            // removes every stream

  // Checkpointing: (seed, offset, subsequence) per name. set_states requires exactly the
  // tracker's names (td::Error naming the missing or unknown ones) and restores them all.
  std::map<std::string, PhiloxState> states() const;
  void set_states(const std::map<std::string, PhiloxState>& states);

 private:
  // unique_ptr: a Generator holds a mutex and cannot move.
  std::map<std::string, std::unique_ptr<Generator>> streams_;
};

}  // namespace td::parallel
