#pragma once
// Topology-aware (two-level) collectives: a Communicator over a group whose members sit on
// several nodes, reducing inside each node first so that only 1/ranks_per_node of the data
// crosses the (slow) links between nodes.
//
// Note [Two-level collectives]: the members of the group, in rank order, are grouped into nodes
// (node ids non-decreasing: consecutive ranks share a node, as launchers place them). With M
// nodes of L members each, member r = m * L + l (node m, local index l) and
//   all_reduce(x):      reduce_scatter inside the node (l keeps chunk l of x, summed over the
//                       node), all_reduce of that chunk across nodes among the members with the
//                       same l, all_gather inside the node;
//   reduce_scatter(x):  x's blocks are reordered so that node-local index l's chunk holds blocks
//                       {m * L + l : m}, reduce-scattered inside the node, then reduce-scattered
//                       across nodes: member m * L + l ends with block m * L + l summed over all,
//                       exactly the flat result's place (ZeRO shards keep their layout);
//   all_gather(x):      the inverse: across nodes, then inside the node, then the blocks put
//                       back in member order.
// Each member sends 2 (M - 1) / M x n / L elements across nodes for an all-reduce of n, against
// 2 (P - 1) / P x n for a flat ring over P = M L members. Nodes of unequal sizes fall back to a
// leader scheme for all_reduce (sum inside the node, all-reduce among the nodes' first members,
// broadcast inside the node) and to the flat collectives for reduce_scatter and all_gather. Avg
// sums and divides once by the group size at the end; Max and Min run flat. The other operations
// (broadcast, point to point, all_to_all, barrier, split) are the flat communicator's.
//
// Every operation runs on the communicator's own worker thread, in submission order (Note
// [Two-level worker] in src/distributed/hierarchical.cpp): an async_op request returns at once,
// so a DDP bucket reduced this way overlaps backward like a flat one.
#include <vector>

#include "tardelli/distributed/communicator.h"

namespace td::distributed {

// A two-level communicator over `flat` (collective over flat: it splits the node and cross-node
// groups). `nodes[r]` is the node id of flat's member r (size flat->size(), non-decreasing).
// td::Error naming the group when `nodes` has the wrong size or is not grouped by node.
CommPtr hierarchical(const CommPtr& flat, const std::vector<int>& nodes);

// Node ids of a group's members from their world ranks and ranks per node (world rank r runs on
// node r / ranks_per_node): the topology of a launcher that fills nodes in rank order.
std::vector<int> nodes_of(const std::vector<int>& world_ranks, int ranks_per_node);

// The communicator under a hierarchical one: its cross-node group on this rank (null when
// `comm` is not hierarchical, or this rank does not take part in the cross-node step), for
// counting the bytes that cross nodes.
CommPtr cross_node_group(const CommPtr& comm);

}  // namespace td::distributed
