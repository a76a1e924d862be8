#pragma once
// The once-per-step agreement of the ranks holding the same GPT layers on their block linears'
// precision state: FP8 scalings and the adaptive policy's statistics.
//
// Note [Amax reduction]: under delayed scaling each rank notes the amaxes its training forwards
// and backwards saw (Note [Deferred amax] in ops/fp8.h); once per step they are max-reduced over
// every rank holding the same layers (data parallel, tensor parallel: a tp shard's amax is part
// of the whole tensor's) and committed, as TransformerEngine's amax reduction group does. Every
// rank then records the same history and uses the same scales, and a tensor-parallel shard is
// quantized with the scale of the whole tensor, as on one rank. A max is exact in any order, so
// the result is the same on every rank and deterministic; a non-finite amax travels as +inf
// (ignored by the history's max, as on one rank).
//
// The adaptive policy's statistics (Note [Adaptive precision] in models/precision_policy.h) are
// reduced the same way: counts summed as int64, errors max-reduced, so every rank decides alike.
#include <vector>

#include "tardelli/distributed/communicator.h"
#include "tardelli/models/gpt.h"
#include "tardelli/models/precision_policy.h"

namespace td::parallel {

// Max-reduces every pending amax of `model`'s FP8 scalings over `group` (null or size 1: this
// rank's) and commits them. Collective over `group`: every rank calls it once per step with a
// model of the same layers. A no-op without FP8.
void sync_fp8_amaxes(models::GPT& model, const distributed::CommPtr& group);

// This step's statistics of `model`'s block linears, reduced over `group` (null: this rank's).
// Collective like sync_fp8_amaxes.
std::vector<models::LinearStats> reduce_linear_stats(const models::GPT& model,
                                                     const distributed::CommPtr& group);

// The end of a training step for the block linears: sync_fp8_amaxes, then with a policy its
// decisions from the reduced statistics, applied to the model (its precisions set, its
// statistics cleared). Returns the decisions (identical on every rank of `group`).
std::vector<models::PrecisionChange> precision_step(models::GPT& model,
                                                    models::PrecisionPolicy* policy,
                                                    const distributed::CommPtr& group);

}  // namespace td::parallel
