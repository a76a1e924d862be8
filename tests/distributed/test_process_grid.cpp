// td::distributed::ProcessGrid at 2 and 4 ranks: the communicators built by split have the
// members the closed-form layout says (ParallelDims::rank_groups, tested on its own in
// test_grid_layout.cpp), checked by all-gathering the world ranks inside every group.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/distributed/process_grid.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {
namespace {

CommPtr world() {
  static CommPtr w = mpi_world();  // timeout: TD_COMM_TIMEOUT_S (ctest: 60 s)
  return w;
}

// Every (tp, cp, pp, dp, ep, order) whose degrees multiply to `world`, that validates.
std::vector<ParallelDims> all_configs(int world) {
  std::vector<ParallelDims> out;
  for (const char* order : {"tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp"})
    for (int tp = 1; tp <= world; ++tp)
      for (int cp = 1; cp <= world; ++cp)
        for (int pp = 1; pp <= world; ++pp)
          for (int ep = 1; ep <= world; ++ep) {
            if (world % (tp * cp * pp) != 0) continue;
            ParallelDims d;
            d.tp = tp;
            d.cp = cp;
            d.pp = pp;
            d.dp = world / (tp * cp * pp);
            d.ep = ep;
            d.order = order;
            try {
              d.validate(world);
            } catch (const Error&) {
              continue;
            }
            out.push_back(d);
          }
  return out;
}

// The world ranks of the members of `comm`, in comm rank order (an all_gather).
std::vector<int> gathered_members(const CommPtr& world_comm, const CommPtr& comm) {
  Tensor mine = full({1}, world_comm->rank(), {DType::Int32});
  Tensor all = empty({comm->size()}, {DType::Int32});
  comm->all_gather(all, mine);
  const int32_t* p = all.data_ptr<int32_t>();
  return std::vector<int>(p, p + comm->size());
}

// Property: for every valid configuration of this world, each standard group's communicator has
// the size and rank the layout gives, its members (gathered over the communicator itself) are
// exactly this rank's layout group, and the grid's coordinates agree with ParallelDims::coords.
TEST(ProcessGrid, SplitGroupsMatchLayout) {
  CommPtr w = world();
  auto configs = all_configs(w->size());
  ASSERT_GE(configs.size(), w->size() == 4 ? 20u : 6u);
  for (const ParallelDims& d : configs) {
    SCOPED_TRACE(d.str());
    ProcessGrid grid(w, d);
    EXPECT_EQ(grid.rank(), w->rank());
    GridCoords c = d.coords(w->rank());
    EXPECT_EQ(grid.coords().tp, c.tp);
    EXPECT_EQ(grid.coords().pp, c.pp);
    EXPECT_EQ(grid.coords().ep, c.ep);
    for (const std::string& axes : ProcessGrid::standard_axes()) {
      SCOPED_TRACE(axes);
      const CommPtr& comm = grid.group(axes);
      std::vector<int> expect = d.group_of(axes, w->rank());
      ASSERT_NE(comm, nullptr);
      EXPECT_EQ(comm->name(), axes);
      EXPECT_EQ(comm->size(), static_cast<int>(expect.size()));
      EXPECT_EQ(expect[comm->rank()], w->rank());
      EXPECT_EQ(grid.group_ranks(axes), expect);
      EXPECT_EQ(gathered_members(w, comm), expect);
    }
    // The named accessors return the same communicators as group().
    EXPECT_EQ(grid.tp(), grid.group("tp"));
    EXPECT_EQ(grid.dp_cp(), grid.group("cp-dp"));
    EXPECT_EQ(grid.dp_cp(), grid.group("dp_cp"));
    EXPECT_EQ(grid.tp_pp(), grid.group("pp-tp"));
    EXPECT_EQ(grid.edp()->size(), d.edp());
  }
}

// Property: a sum over a grid group adds exactly its members' values (the groups really are
// separate communicators: a tp all_reduce does not mix in other tp groups).
TEST(ProcessGrid, GroupAllReduceSumsMembersOnly) {
  CommPtr w = world();
  ParallelDims d;
  d.tp = 2;
  d.dp = w->size() / 2;
  ProcessGrid grid(w, d);
  for (const char* axes : {"tp", "dp", "tp-pp"}) {
    Tensor t = full({3}, 1 << w->rank(), {DType::Int64});
    grid.group(axes)->all_reduce(t);
    int64_t expect = 0;
    for (int r : d.group_of(axes, w->rank())) expect += int64_t{1} << r;
    EXPECT_EQ(t.data_ptr<int64_t>()[2], expect) << axes;
  }
}

// Property: a grid over a world of the wrong size, an unknown group and extra axes behave as
// documented (errors raised identically on every rank, so no rank is left in a collective).
TEST(ProcessGrid, ErrorsAndExtraAxes) {
  CommPtr w = world();
  ParallelDims bad;
  bad.tp = 3;
  try {
    ProcessGrid g(w, bad);
    ADD_FAILURE() << "expected td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp*cp*pp*dp = 3 but world size is " +
                                         std::to_string(w->size())),
              std::string::npos)
        << e.what();
  }
  ParallelDims d;
  d.dp = w->size();
  ProcessGrid grid(w, d, {"tp-cp-dp-pp"});
  EXPECT_EQ(grid.group("tp-cp-dp-pp")->size(), w->size());
  EXPECT_EQ(grid.group("world"), w);
  EXPECT_EQ(grid.group_ranks("world").size(), static_cast<size_t>(w->size()));
  EXPECT_THROW(grid.group("tp-dp"), Error);
  try {
    grid.group("tp-dp");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no group 'tp-dp' (built: tp, cp, pp, dp"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ProcessGrid(nullptr, d), Error);
}

}  // namespace
}  // namespace td::distributed
