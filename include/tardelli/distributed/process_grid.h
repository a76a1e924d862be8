#pragma once
// The process grid: how the ranks of a job are laid out over the parallel dimensions, and the
// communicators of every group (torchtitan's ParallelDims + Megatron-core's RankGenerator).
//
// Note [Rank layout]: ranks are numbered in a mixed radix over the dimensions named by
// `order`, the first varying fastest. With the default "tp-cp-ep-dp-pp", tp peers are adjacent
// ranks (the fastest links) and pp stages are the farthest apart. A group over some axes
// ("tp", "dp-cp", ...) is the set of ranks that differ only in those axes' coordinates; its
// members are listed in increasing rank order. This is Megatron-core's closed form
// (generate_masked_orthogonal_rank_groups), so checkpoints and logs line up with Megatron's.
//
// Note [Expert layout]: expert layers reuse the ranks of the dense dp x cp dimension: there the
// grid is tp-ep-edp-pp (in `order`'s order, cp taken as 1) with edp = dp * cp / ep (the expert
// data-parallel degree); tp and pp groups are the same in both layouts. Axis strings that name
// "ep" or "edp" use the expert layout; mixing them with "dp" or "cp" is an error.
#include <map>
#include <string>
#include <vector>

#include "tardelli/distributed/communicator.h"

namespace td::distributed {

// A rank's coordinate along every axis.
struct GridCoords {
  int tp = 0, cp = 0, pp = 0, dp = 0;  // dense layout
  int ep = 0, edp = 0;                 // expert layout (Note [Expert layout])
};

struct ParallelDims {
  int tp = 1;  // tensor parallel
  int cp = 1;  // context (sequence) parallel
  int pp = 1;  // pipeline parallel
  int dp = 1;  // data parallel
  int ep = 1;  // expert parallel, carved out of dp * cp
  std::string order = "tp-cp-ep-dp-pp";

  int world_size() const { return tp * cp * pp * dp; }
  int edp() const { return ep > 0 ? dp * cp / ep : 0; }
  // Throws td::Error unless every degree is >= 1, tp*cp*pp*dp == world_size, ep divides dp*cp
  // `order` names each of tp, cp, ep, dp, pp at most once (an omitted axis must have degree 1)
  // and the expert layout has the same tp and pp groups as the dense one.
  void validate(int world_size) const;

  // The groups over `axes` ("tp", "dp-cp", "tp-pp", "ep", "edp", "tp-ep", ...; the order of the
  // names in `axes` does not matter): a partition of the world, each group in increasing rank
  // order, the groups sorted by their first rank. Requires a valid configuration.
  std::vector<std::vector<int>> rank_groups(const std::string& axes) const;
  // The group over `axes` that contains `rank`.
  std::vector<int> group_of(const std::string& axes, int rank) const;
  GridCoords coords(int rank) const;
  // Inverse of coords() for the dense layout.
  int rank_of(int tp, int cp, int pp, int dp) const;

  std::string str() const;  // "ParallelDims(tp=2, cp=1, pp=2, dp=1, ep=1, order=tp-cp-ep-dp-pp)"
};

// The communicators of one rank's groups, built collectively from the world communicator. Each
// group's communicator is named after its axes ("tp", "dp-cp", ...). A ProcessGrid holds no
// global state: layers receive the CommPtr they use (grid.tp(), grid.dp(), ...).
class ProcessGrid {
 public:
  // The axes every grid builds, in construction order.
  static const std::vector<std::string>& standard_axes();

  // Collective over `world`: every rank calls it with the same dims. Validates dims against
  // world->size() and splits `world` once per standard axis set (plus `extra_axes`).
  ProcessGrid(CommPtr world, ParallelDims dims, const std::vector<std::string>& extra_axes = {});

  const ParallelDims& dims() const { return dims_; }
  const GridCoords& coords() const { return coords_; }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }

  const CommPtr& world() const { return world_; }
  const CommPtr& tp() const { return group("tp"); }
  const CommPtr& cp() const { return group("cp"); }
  const CommPtr& pp() const { return group("pp"); }
  const CommPtr& dp() const { return group("dp"); }
  const CommPtr& ep() const { return group("ep"); }
  const CommPtr& edp() const { return group("edp"); }
  const CommPtr& dp_cp() const { return group("dp-cp"); }
  const CommPtr& tp_cp() const { return group("tp-cp"); }
  const CommPtr& tp_pp() const { return group("tp-pp"); }
  const CommPtr& tp_ep() const { return group("tp-ep"); }
  // By axes ("dp-cp" or "dp_cp"; "world"); td::Error naming the built groups when unknown.
  const CommPtr& group(const std::string& axes) const;
  // This rank's group members (world ranks) for a built group (or "world").
  const std::vector<int>& group_ranks(const std::string& axes) const;
  // The built groups' names, in construction order.
  const std::vector<std::string>& group_names() const;

  bool is_first_pp_stage() const { return coords_.pp == 0; }
  bool is_last_pp_stage() const { return coords_.pp == dims_.pp - 1; }

 private:
  std::string canonical(const std::string& axes) const;

  CommPtr world_;
  ParallelDims dims_;
  GridCoords coords_;
  std::map<std::string, CommPtr> groups_;
  std::map<std::string, std::vector<int>> members_;
  std::vector<std::string> names_;
  std::vector<int> world_ranks_;
};

}  // namespace td::distributed
