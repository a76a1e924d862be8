// Two-level collectives (include/tardelli/distributed/hierarchical.h) at 2 and 4 ranks, with
// the world split into simulated nodes of every size that divides it and of unequal sizes.
//
// Property: every collective equals the flat one. Inputs are integers times 1/8 of magnitude
// <= 64, so every sum is exact in fp32 whatever its order: sum, avg (a power-of-two group) and
// max must match bitwise; reduce_scatter and all_gather must put every block in the flat
// result's place; a DDP whose group is two-level gives the flat DDP's gradients (fp32 sums of
// real gradients in another order: tolerance 1e-6 relative); the cross-node group carries
// 1 / ranks_per_node of the bytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data_parallel_test_util.h"
#include "tardelli/distributed/data_parallel.h"
#include "tardelli/distributed/hierarchical.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "test_util.h"

namespace td::distributed {
namespace {

using td::test::error_of;
using td::test::same_bytes;

CommPtr world() {
  static CommPtr w = mpi_world();
  return w;
}

// Rank r's input: exact multiples of 1/8.
Tensor input(int rank, int64_t n, uint64_t seed) {
  Generator g(seed + static_cast<uint64_t>(rank));
  Tensor t = randint(-512, 512, {n}, {DType::Int64, kCPU, false}, &g).to(DType::Float32);
  return mul(t, 0.125);
}

// World ranks 0 .. P-1: the members of the world group.
std::vector<int> all_ranks(int P) {
  std::vector<int> ranks(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

// The node layouts for this world: every ranks-per-node that divides it, and (4 ranks) 3 + 1.
std::vector<std::vector<int>> layouts(int P) {
  std::vector<std::vector<int>> out;
  for (int rpn = 1; rpn <= P; ++rpn) {
    if (P % rpn == 0) out.push_back(nodes_of(all_ranks(P), rpn));
  }
  if (P == 4) out.push_back({0, 0, 0, 1});
  return out;
}

std::string str(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += std::to_string(x);
  return s;
}

TEST(Hierarchical, CollectivesEqualFlat) {
  const CommPtr w = world();
  const int P = w->size(), r = w->rank();
  for (const auto& nodes : layouts(P)) {
    const CommPtr h = hierarchical(w, nodes);
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1001}}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        Tensor a = input(r, n, 11), b = a.clone();
        w->all_reduce(a, op);
        h->all_reduce(b, op, /*async_op=*/true)->wait();
        EXPECT_TRUE(same_bytes(a, b))
            << "all_reduce " << reduce_op_name(op) << " n " << n << " nodes " << str(nodes);
      }
      Tensor in = input(r, n * P, 13);
      Tensor fa = Tensor::empty({n}, DType::Float32, kCPU), fb = fa.clone();
      w->reduce_scatter(fa, in, ReduceOp::Avg);
      h->reduce_scatter(fb, in, ReduceOp::Avg);
      EXPECT_TRUE(same_bytes(fa, fb)) << "reduce_scatter n " << n << " nodes " << str(nodes);
      Tensor mine = input(r, n, 17);
      Tensor ga = Tensor::empty({n * P}, DType::Float32, kCPU), gb = ga.clone();
      w->all_gather(ga, mine);
      h->all_gather(gb, mine);
      EXPECT_TRUE(same_bytes(ga, gb)) << "all_gather n " << n << " nodes " << str(nodes);
    }
  }
}

// Property (Note [Two-level worker]): async operations return at once and run in submission
// order on the communicator's worker: several all-reduces and a reduce-scatter in flight, waited
// for in reverse order, give the flat results bitwise; a blocking call after them sees them done.
TEST(Hierarchical, AsyncOperationsRunInOrder) {
  const CommPtr w = world();
  const int P = w->size(), r = w->rank();
  const CommPtr h = hierarchical(w, nodes_of(all_ranks(P), P >= 4 ? 2 : 1));
  std::vector<Tensor> mine, want;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 5; ++k) {
    Tensor a = input(r, 100 + k, 20 + static_cast<uint64_t>(k));
    Tensor b = a.clone();
    w->all_reduce(b, ReduceOp::Sum);
    want.push_back(b);
    mine.push_back(a);
    works.push_back(h->all_reduce(mine.back(), ReduceOp::Sum, /*async_op=*/true));
  }
  Tensor in = input(r, 8 * P, 40), out = Tensor::empty({8}, DType::Float32, kCPU);
  Tensor flat_out = out.clone();
  w->reduce_scatter(flat_out, in, ReduceOp::Sum);
  works.push_back(h->reduce_scatter(out, in, ReduceOp::Sum, /*async_op=*/true));
  for (size_t k = works.size(); k-- > 0;) works[k]->wait();
  for (size_t k = 0; k < mine.size(); ++k) EXPECT_TRUE(same_bytes(mine[k], want[k])) << k;
  EXPECT_TRUE(same_bytes(out, flat_out));
  h->barrier();
}

// Property: the cross-node step of an all-reduce of n fp32 carries n / ranks_per_node elements
// per rank (its input bytes), against n for the flat collective.
TEST(Hierarchical, CrossNodeBytesShrinkByRanksPerNode) {
  const CommPtr w = world();
  const int P = w->size();
  if (P < 4) GTEST_SKIP() << "needs two nodes of two ranks (4 ranks)";
  const int rpn = 2;
  const CommPtr h = hierarchical(w, nodes_of(all_ranks(P), rpn));
  const CommPtr cross = cross_node_group(h);
  ASSERT_NE(cross, nullptr);
  cross->reset_stats();
  Tensor t = input(w->rank(), 4096, 3);
  h->all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(cross->stats().bytes, 4096 * 4 / rpn);
  EXPECT_EQ(cross_node_group(w), nullptr);
}

// Property: a DDP over the two-level group gives the flat DDP's averaged gradients, with
// all_reduce buckets and with ZeRO-1 reduce-scatter shards.
TEST(Hierarchical, DataParallelGradientsEqualFlat) {
  const CommPtr w = world();
  const CommPtr h = hierarchical(w, nodes_of(all_ranks(w->size()), 2));
  for (bool zero : {false, true})
    dp_test::expect_same_grads_as_flat(w, h, {8192, true, zero, true}, zero, 9);
}

TEST(Hierarchical, BadNodeListsAreErrors) {
  const CommPtr w = world();
  EXPECT_NE(error_of([&] { hierarchical(w, {0}); }).find("node ids for"), std::string::npos);
  if (w->size() >= 2) {
    std::vector<int> down(static_cast<size_t>(w->size()), 0);
    down[0] = 1;
    EXPECT_NE(error_of([&] { hierarchical(w, down); }).find("must not decrease"),
              std::string::npos);
  }
  EXPECT_NE(error_of([] {
              nodes_of({0, 1}, 0);
            }).find("ranks_per_node must be >= 1"),
            std::string::npos);
}

}  // namespace
}  // namespace td::distributed
