#pragma once
// td::models::ParamUnits: how a model tells a parameter-sharding layer (ZeRO-3 / FSDP) when each
// group of its parameters is about to be used and when it is done with it. The model groups its
// parameters into units (the GPT: Note [GPT parameter units] in gpt.h) and calls materialize()
// before a unit's forward and release() after it; the implementation decides what that costs
// (td::distributed::FullyShardedDataParallel all-gathers the unit's parameter shards and frees
// them again). Like GPTParallelism, this interface is all the model layer knows of distribution:
// no communicator appears here.
//
// Contract for implementations:
//   - materialize(u): when it returns, every parameter of unit u holds its full value (the same
//     tensors as always, their storage refilled: Note [Released storage] in core/storage.h), or,
//     for a unit gathered in the compute dtype, its compute_param() copy does.
//   - release(units, y): the forward of `units` produced y. Their parameters may be freed now.
//     The returned tensor equals y; when autograd records it, its backward makes the units'
//     parameters full again before any gradient flows into the ops that saved them, so a
//     backward never reads a freed parameter. The gradients' own handling (reduce-scatter into a
//     shard) belongs to the implementation too.
//   - compute_param(p, dtype): a materialized parameter's copy in the compute dtype when the
//     implementation gathered one (ZeRO-3 gathers blocks in bf16 over fp32 shards), else
//     nullopt (the model then casts p itself). Differentiable: its gradient, cast to p's dtype,
//     accumulates into p. The model asks for every weight it casts.
#include <cstdint>
#include <optional>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::models {

class ParamUnits {
 public:
  virtual ~ParamUnits() = default;
  virtual void materialize(int64_t unit) = 0;
  virtual Tensor release(const std::vector<int64_t>& units, const Tensor& y) = 0;
  virtual std::optional<Tensor> compute_param(const Tensor& /*p*/, DType /*dtype*/) {
    return std::nullopt;
  }
};

}  // namespace td::models
