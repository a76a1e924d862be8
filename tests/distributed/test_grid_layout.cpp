// ParallelDims' rank layout (pure arithmetic; no communication). Every rank of the MPI test job
// runs these too, which is harmless.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/distributed/process_grid.h"
#include "test_util.h"

namespace td::distributed {
namespace {

using td::test::error_of;

using Groups = std::vector<std::vector<int>>;

std::vector<std::string> tokens(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t p = s.find('-', start);
    out.push_back(s.substr(start, p == std::string::npos ? p : p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

// The reference layout, written from the definition in Note [Rank layout]: the rank is the
// mixed-radix number whose digits are the coordinates, in `order` (completed with the missing
// axes), first fastest. `degree` maps each axis to its size in this layout.
std::map<std::string, int> ref_coords(int rank, const std::string& order,
                                      std::map<std::string, int> degree) {
  std::vector<std::string> axes = tokens(order);
  for (const char* a : {"tp", "cp", "ep", "dp", "pp"})
    if (std::find(axes.begin(), axes.end(), a) == axes.end()) axes.push_back(a);
  std::map<std::string, int> c;
  for (const auto& a : axes) {
    c[a] = rank % degree[a];
    rank /= degree[a];
  }
  return c;
}

// Reference groups over `axes`: ranks whose coordinates agree on every other axis form one
// group; members and groups listed in increasing rank order.
Groups ref_groups(const ParallelDims& d, const std::string& axes) {
  std::vector<std::string> sel = tokens(axes);
  bool expert = std::find(sel.begin(), sel.end(), "ep") != sel.end() ||
                std::find(sel.begin(), sel.end(), "edp") != sel.end();
  std::map<std::string, int> degree =
      expert ? std::map<std::string, int>{{"tp", d.tp},
                                          {"cp", 1},
                                          {"ep", d.ep},
                                          {"dp", d.dp * d.cp / d.ep},
                                          {"pp", d.pp}}
             : std::map<std::string, int>{
                   {"tp", d.tp}, {"cp", d.cp}, {"ep", 1}, {"dp", d.dp}, {"pp", d.pp}};
  for (auto& s : sel)
    if (s == "edp") s = "dp";
  std::map<std::vector<int>, std::vector<int>> buckets;
  for (int r = 0; r < d.world_size(); ++r) {
    auto c = ref_coords(r, d.order, degree);
    std::vector<int> key;
    for (const auto& [axis, v] : c)
      if (std::find(sel.begin(), sel.end(), axis) == sel.end()) key.push_back(v);
    buckets[key].push_back(r);
  }
  Groups g;
  for (auto& [k, members] : buckets) g.push_back(members);
  std::sort(g.begin(), g.end());
  return g;
}

ParallelDims dims(int tp, int cp, int pp, int dp, int ep, const std::string& order) {
  ParallelDims d;
  d.tp = tp;
  d.cp = cp;
  d.pp = pp;
  d.dp = dp;
  d.ep = ep;
  d.order = order;
  return d;
}

// Property: for many (degrees, order) tuples, rank_groups matches the coordinate definition for
// every axis set, the groups partition the world, each has the product of its axes' degrees,
// and every rank's coords agree with the reference and round-trip through rank_of.
TEST(GridLayout, GroupsMatchCoordinateDefinition) {
  std::vector<ParallelDims> configs;
  for (const char* order : {"tp-cp-ep-dp-pp", "tp-pp-dp", "pp-tp-cp-ep-dp", "dp-cp-ep-tp-pp"})
    for (int tp : {1, 2, 4})
      for (int cp : {1, 2})
        for (int pp : {1, 2, 3})
          for (int dp : {1, 2, 4})
            for (int ep : {1, 2, 4}) {
              ParallelDims d = dims(tp, cp, pp, dp, ep, order);
              bool named_ok = std::string(order).find("cp") != std::string::npos || cp == 1;
              if ((dp * cp) % ep != 0 || !named_ok) continue;
              if (std::string(order).find("ep") == std::string::npos && ep > 1) continue;
              try {
                d.validate(d.world_size());
              } catch (const Error&) {
                continue;  // orders that split expert/dense tp or pp groups (tested below)
              }
              configs.push_back(d);
            }
  ASSERT_GT(configs.size(), 100u);
  const std::vector<std::string> dense = {"tp",    "cp",    "pp",       "dp",    "dp-cp",
                                          "tp-cp", "tp-pp", "tp-dp-pp", "cp-dp", "tp-cp-dp-pp"};
  const std::vector<std::string> expert = {"ep", "edp", "tp-ep", "tp-ep-pp", "ep-edp"};
  for (const auto& d : configs) {
    SCOPED_TRACE(d.str());
    const int world = d.world_size();
    for (const auto* axes : {&dense, &expert})
      for (const auto& ax : *axes) {
        SCOPED_TRACE(ax);
        Groups got = d.rank_groups(ax);
        EXPECT_EQ(got, ref_groups(d, ax));
        std::vector<int> seen(world, 0);
        for (const auto& g : got) {
          EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
          EXPECT_EQ(g.size(), got[0].size());
          for (int r : g) ++seen[r];
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), world);
      }
    EXPECT_EQ(d.rank_groups("tp")[0].size(), static_cast<size_t>(d.tp));
    EXPECT_EQ(d.rank_groups("dp-cp")[0].size(), static_cast<size_t>(d.dp * d.cp));
    EXPECT_EQ(d.rank_groups("ep")[0].size(), static_cast<size_t>(d.ep));
    EXPECT_EQ(d.rank_groups("edp")[0].size(), static_cast<size_t>(d.dp * d.cp / d.ep));
    // tp and pp groups are the same for dense and expert layers (Note [Expert layout]).
    EXPECT_EQ(d.rank_groups("tp-pp"), ref_groups(d, "tp-pp"));
    for (int r = 0; r < world; ++r) {
      GridCoords c = d.coords(r);
      auto ref = ref_coords(r, d.order,
                            {{"tp", d.tp}, {"cp", d.cp}, {"ep", 1}, {"dp", d.dp}, {"pp", d.pp}});
      auto eref = ref_coords(
          r, d.order,
          {{"tp", d.tp}, {"cp", 1}, {"ep", d.ep}, {"dp", d.dp * d.cp / d.ep}, {"pp", d.pp}});
      EXPECT_EQ(c.tp, ref["tp"]);
      EXPECT_EQ(c.cp, ref["cp"]);
      EXPECT_EQ(c.dp, ref["dp"]);
      EXPECT_EQ(c.pp, ref["pp"]);
      EXPECT_EQ(c.ep, eref["ep"]);
      EXPECT_EQ(c.edp, eref["dp"]);
      EXPECT_EQ(d.rank_of(c.tp, c.cp, c.pp, c.dp), r);
      // A rank's group over some axes holds exactly the ranks sharing its other coordinates.
      auto g = d.group_of("tp", r);
      EXPECT_NE(std::find(g.begin(), g.end(), r), g.end());
    }
  }
}

// Property: the worked example of Megatron-core's initialize_model_parallel docstring (16 ranks,
// tp=2, pp=4, dp=2, default order) and two hand-computed expert layouts.
TEST(GridLayout, KnownLayouts) {
  ParallelDims d = dims(2, 1, 4, 2, 1, "tp-cp-ep-dp-pp");
  EXPECT_EQ(d.rank_groups("tp"),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(d.rank_groups("pp"),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(d.rank_groups("dp"),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(d.rank_groups("tp-pp"),
            (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));

  // 8 ranks, tp=2, dp=4, ep=2: expert grid tp(2)-ep(2)-edp(2).
  ParallelDims e = dims(2, 1, 1, 4, 2, "tp-cp-ep-dp-pp");
  EXPECT_EQ(e.rank_groups("ep"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(e.rank_groups("edp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(e.rank_groups("tp-ep"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(e.rank_groups("dp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));

  // 8 ranks, cp=2, dp=2, ep=4: experts span the whole dp x cp block.
  ParallelDims c = dims(2, 2, 1, 2, 4, "tp-cp-ep-dp-pp");
  EXPECT_EQ(c.rank_groups("cp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(c.rank_groups("dp-cp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(c.rank_groups("ep"), c.rank_groups("dp-cp"));
  EXPECT_EQ(c.rank_groups("edp"), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  GridCoords c5 = c.coords(5);  // 5 = tp 1 + 2 * (cp 0) + 4 * (dp 1)
  EXPECT_EQ(c5.tp, 1);
  EXPECT_EQ(c5.cp, 0);
  EXPECT_EQ(c5.dp, 1);
  EXPECT_EQ(c5.ep, 2);
  EXPECT_EQ(c5.edp, 0);
}

// Property: invalid configurations and axis strings raise td::Error with a message naming the
// offending numbers or names.
TEST(GridLayout, BadInputRaises) {
  EXPECT_NE(error_of([] {
              dims(2, 1, 3, 1, 1, "tp-cp-ep-dp-pp").validate(4);
            }).find("ParallelDims: tp*cp*pp*dp = 6 but world size is 4"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              dims(0, 1, 1, 4, 1, "tp-cp-ep-dp-pp").validate(4);
            }).find("every degree must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              dims(1, 1, 1, 4, 3, "tp-cp-ep-dp-pp").validate(4);
            }).find("ep = 3 must divide dp*cp = 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { dims(2, 1, 1, 2, 1, "tp-xp-dp").validate(4); }).find("unknown axis 'xp'"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { dims(2, 1, 1, 2, 1, "tp-dp-tp").validate(4); }).find("axis 'tp' appears twice"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              dims(2, 1, 2, 1, 1, "tp-dp").validate(4);
            }).find("pp = 2 but order 'tp-dp' does not name it"),
            std::string::npos);
  // pp between cp and dp: expert layers (edp = dp*cp/ep) would get other pp peers than dense.
  EXPECT_NE(error_of([] {
              dims(1, 2, 2, 2, 2, "tp-cp-pp-ep-dp").validate(8);
            }).find("different pp groups"),
            std::string::npos);
  ParallelDims ok = dims(2, 1, 1, 2, 2, "tp-cp-ep-dp-pp");
  EXPECT_NE(error_of([&] { ok.rank_groups("dp-ep"); }).find("mixes the expert axes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ok.rank_groups("tensor"); }).find("unknown axis 'tensor'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ok.coords(4); }).find("rank 4 is outside the world of size 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ok.rank_of(2, 0, 0, 0); }).find("out of range"), std::string::npos);
}

}  // namespace
}  // namespace td::distributed
