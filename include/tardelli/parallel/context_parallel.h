#pragma once
// Context parallelism: attention over a sequence split across the ranks of a cp group.
//
// Note [Zigzag layout]: a sequence of T tokens is cut into 2N equal chunks (N = cp size, chunk
// c = T / 2N tokens); rank i holds chunks i and 2N-1-i, back to back ([B, 2c, ...] locally).
// Under causal attention chunk j attends to chunks <= j, so a contiguous split would leave the
// last rank N times the work of the first; with one early and one late chunk per rank every
// rank does the same work (Megatron-core / TransformerEngine's load-balanced layout).
//
// Two ways to compute attention on that layout (context_parallel_attention):
//   CPComm::Ring (ring attention): every rank keeps its queries; the key/value blocks travel
//     around the group (rank r sends to r+1), one step per rank, each step's transfer overlapped
//     with the attention on the block in hand; the partial outputs are merged with the
//     log-sum-exp rule (Note [Ring merge] in context_parallel.cpp). Backward runs the ring
//     again: dq stays local, dk/dv accumulate while travelling and return to their owner.
//   CPComm::AllToAll (DeepSpeed-Ulysses): an all-to-all turns the sequence-sharded q/k/v into
//     head-sharded full-sequence tensors (H/N heads, all T tokens in natural order), local
//     attention runs on those, and a second all-to-all turns the output back; the backward is
//     the same two all-to-alls reversed. Needs H and Hkv divisible by N.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tardelli/core/tensor.h"
#include "tardelli/distributed/communicator.h"

namespace td::parallel {

enum class CPComm { Ring, AllToAll };
// "ring" | "a2a"; td::Error naming the choices otherwise.
CPComm parse_cp_comm(const std::string& s);
const char* cp_comm_name(CPComm c);

// The global positions of rank `rank`'s 2c tokens under the zigzag layout of T tokens over
// `size` ranks (Note [Zigzag layout]). td::Error unless T is divisible by 2 * size.
std::vector<int64_t> zigzag_positions(int64_t T, int rank, int size);
// Rank `rank`'s zigzag part of a full tensor along `dim` (a contiguous copy, not recorded by
// autograd): chunks rank and 2*size-1-rank, concatenated.
Tensor zigzag_slice(const Tensor& x, int64_t dim, int rank, int size);
// The inverse, collective over `cp`: every rank passes its zigzag part along `dim` and receives
// the full tensor in natural order (not recorded by autograd).
Tensor zigzag_gather(const Tensor& x, const distributed::CommPtr& cp, int64_t dim);

// softmax(q k^T * scale [+ causal mask]) v over the whole sequence of the cp group, for this
// rank's queries. q: [B, H, 2c, D], k: [B, Hkv, 2c, D], v: [B, Hkv, 2c, Dv] (any strides), this
// rank's zigzag tokens (Note [Zigzag layout]); Hkv divides H. Returns this rank's rows of the
// output, [B, H, 2c, Dv] in q's dtype, differentiable in q, k and v. Causal masking is by global
// position (query p sees keys <= p). Every rank of `cp` calls it with the same shapes, dtypes
// and flags. A group of size 1 is plain flash attention. td::Error (naming the op, shapes and
// the rank) for mismatched shapes, an odd local length, or (AllToAll) H or Hkv not divisible
// by the group size.
Tensor context_parallel_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const distributed::CommPtr& cp, bool is_causal,
                                  CPComm comm = CPComm::Ring,
                                  std::optional<double> scale = std::nullopt);

// Note [Context-parallel loss]: each cp rank's loss is the mean over its own tokens; every rank
// holds the same number of them, so the mean over the whole sequence is the average of the
// ranks' means. Forward: that average (all-reduce, every rank sees the full loss). Backward:
// the identity, so each rank's gradients are those of its local mean; the data-parallel
// reduction, run over the dp x cp group (Megatron's dp-cp group) and averaging, then gives the
// gradient of the global mean. That is exact when every rank counts the same number of
// targets; the GPT's layout weights each rank's mean by its share of the counted targets first
// when ignore_index makes them differ (Note [Ignored targets under cp] in parallelize.cpp).
Tensor context_parallel_loss_mean(const Tensor& local_mean, const distributed::CommPtr& cp);

}  // namespace td::parallel
