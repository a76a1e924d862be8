#pragma once
// Expert parallelism: the experts of a mixture-of-experts layer split over an `ep` group (rank r
// holds experts [r E/ep, (r+1) E/ep), their stacked weights sliced along dim 0), each rank
// routing its own tokens (Megatron-core's token dispatcher with the all-to-all, in our own code).
//
// Note [Expert-parallel dispatch]: the layer permutes its rows by global expert (ops/
// moe_dispatch.h), so the rows for rank j's experts are contiguous, in expert order. The dispatch
//   1. exchanges every rank's rows per expert (exchange_counts: one all-gather of E int64);
//   2. sends each rank the rows of its experts (all_to_all_rows): this rank receives, back to back
//      by source rank, each source's rows for its local experts, in local-expert order;
//   3. regroups them by local expert (source order inside an expert: index_select), runs the
//      local experts (grouped_linear over the local expert weights), undoes the regrouping, and
//   4. sends the results back the way the rows came (all_to_all_rows with the counts swapped).
// Both all-to-alls and the regrouping are differentiable: backward moves the gradient rows back
// over the same routes. The router is replicated over ep; its and the dense layers' gradients
// come from every rank's tokens (reduced over the whole data-parallel group), the local
// experts' gradients from every rank's tokens routed to them (reduced over the expert-data-
// parallel group only: ProcessGrid "edp").
#include "tardelli/distributed/communicator.h"
#include "tardelli/models/gpt.h"
#include "tardelli/models/moe_mlp.h"

namespace td::parallel {

// The dispatch for MoEOptions::dispatch over `ep` (size 1: every expert local, rows unchanged).
// The layer's rows_per_expert must have E entries with E divisible by ep->size(); td::Error
// naming E, ep and the rank otherwise.
models::MoEExpertDispatch expert_parallel_dispatch(distributed::CommPtr ep);

// Lays the GPT's experts out over `ep` (GPT::set_expert_parallel with the dispatch above): each
// rank keeps num_experts / ep of every MoE layer's experts. The dense parameters and the router
// stay whole. Gradients: the local experts' accumulate the contributions of every ep rank's
// tokens (sum over the ep group's losses); a trainer averaging the dense gradients over dp x ep
// divides the expert ones by the same dp x ep size but reduces them over the expert-data-
// parallel group only (Note [Expert layout] in distributed/process_grid.h; the trainer's
// ExpertDataParallel in python/tardelli/distributed/expert_parallel.py does it with grad_scale).
void apply_expert_parallel(models::GPT& model, const distributed::CommPtr& ep);

}  // namespace td::parallel
