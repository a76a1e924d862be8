// The host-staged communicator (include/tardelli/distributed/host_staged.h) at 2 and 4 ranks.
//
// Property: staging moves the bytes and nothing else. With host tensors staged like device ones
// (the CPU stand-in for a GPU), every operation equals the MPI communicator's bitwise (inputs are
// multiples of 1/8, so every sum is exact), blocking and async; an async operation leaves its
// output tensor untouched until wait() (the copy back happens there: Note [Host staging]), and
// sub-groups from split() stage too. Where a GPU is present, the same operations on CUDA tensors
// equal the CPU results (several ranks share the device, as on the lent test machine).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tardelli/core/cuda_runtime.h"
#include "tardelli/distributed/host_staged.h"
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

// Runs every collective on `c` with tensors on `device` (async where `async`), returning the
// results as CPU tensors in a fixed order.
std::vector<Tensor> every_collective(const CommPtr& c, Device device, bool async) {
  const int P = c->size(), r = c->rank();
  std::vector<Tensor> out;
  std::vector<WorkPtr> works;
  auto on = [&](Tensor t) { return t.to(device); };
  auto issue = [&](WorkPtr w) {
    if (w) works.push_back(std::move(w));
  };
  std::vector<Tensor> results;
  Tensor ar = on(input(r, 1001, 1));
  issue(c->all_reduce(ar, ReduceOp::Sum, async));
  results.push_back(ar);
  Tensor av = on(input(r, 64, 2));
  issue(c->all_reduce(av, ReduceOp::Avg, async));
  results.push_back(av);
  Tensor mx = on(input(r, 7, 3));
  issue(c->all_reduce(mx, ReduceOp::Max, async));
  results.push_back(mx);
  Tensor ag = on(zeros({5 * P}));
  issue(c->all_gather(ag, on(input(r, 5, 4)), async));
  results.push_back(ag);
  Tensor rs = on(zeros({6}));
  issue(c->reduce_scatter(rs, on(input(r, 6 * P, 5)), ReduceOp::Sum, async));
  results.push_back(rs);
  Tensor bc = on(input(r, 9, 6));
  issue(c->broadcast(bc, P - 1, async));
  results.push_back(bc);
  // Uneven all-to-all: rank r sends j + 1 elements to rank j.
  std::vector<int64_t> in_splits, out_splits;
  int64_t n_in = 0, n_out = 0;
  for (int j = 0; j < P; ++j) {
    in_splits.push_back(j + 1);
    out_splits.push_back(r + 1);
    n_in += j + 1;
    n_out += r + 1;
  }
  Tensor a2a = on(zeros({n_out}));
  issue(c->all_to_all(a2a, on(input(r, n_in, 7)), out_splits, in_splits, async));
  results.push_back(a2a);
  // A ring of sends and receives.
  Tensor got = on(zeros({11}));
  if (r % 2 == 0) {
    issue(c->send(on(input(r, 11, 8)), (r + 1) % P, 3, async));
    issue(c->recv(got, (r + P - 1) % P, 3, async));
  } else {
    issue(c->recv(got, (r + P - 1) % P, 3, async));
    issue(c->send(on(input(r, 11, 8)), (r + 1) % P, 3, async));
  }
  results.push_back(got);
  for (auto& w : works) w->wait();
  for (auto& t : results) out.push_back(t.to(kCPU));
  return out;
}

TEST(HostStaged, EveryOperationEqualsTheHostCommunicator) {
  const CommPtr w = world();
  const CommPtr s = host_staged(w, /*stage_host_tensors=*/true);
  EXPECT_EQ(std::string(s->backend()), "mpi-staged");
  EXPECT_EQ(s->rank(), w->rank());
  EXPECT_EQ(s->size(), w->size());
  const auto want = every_collective(w, kCPU, false);
  for (bool async : {false, true}) {
    const auto got = every_collective(s, kCPU, async);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k)
      EXPECT_TRUE(same_bytes(got[k], want[k])) << "operation " << k << " async " << async;
  }
}

// Property (Note [Host staging]): the result reaches the tensor in wait(), not before; the host
// operation runs meanwhile (the host communicator's own Work).
TEST(HostStaged, AsyncResultArrivesAtWait) {
  const CommPtr w = world();
  const CommPtr s = host_staged(w, true);
  Tensor t = input(w->rank(), 256, 9), before = t.clone(), want = t.clone();
  w->all_reduce(want, ReduceOp::Sum);
  WorkPtr work = s->all_reduce(t, ReduceOp::Sum, /*async_op=*/true);
  ASSERT_NE(work, nullptr);
  // The host all-reduce may be done already, but the staged tensor is written only in wait().
  EXPECT_TRUE(same_bytes(t, before));
  work->wait();
  EXPECT_TRUE(same_bytes(t, want));
  work->wait();  // a second wait copies nothing again
  EXPECT_TRUE(same_bytes(t, want));
}

TEST(HostStaged, SplitGroupsStageToo) {
  const CommPtr w = world();
  const CommPtr s = host_staged(w, true);
  const int r = w->rank();
  const CommPtr half = s->split(r % 2, r, "half");
  const CommPtr flat_half = w->split(r % 2, r, "half");
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(std::string(half->backend()), "mpi-staged");
  EXPECT_EQ(half->name(), "half");
  Tensor a = input(r, 33, 10), b = a.clone();
  half->all_reduce(a, ReduceOp::Sum);
  flat_half->all_reduce(b, ReduceOp::Sum);
  EXPECT_TRUE(same_bytes(a, b));
  EXPECT_EQ(s->split(-1, r, "none"), nullptr);
}

TEST(HostStaged, BadInputIsAnError) {
  EXPECT_NE(error_of([] { host_staged(nullptr); }).find("host communicator is null"),
            std::string::npos);
  const CommPtr s = host_staged(world(), true);
  EXPECT_NE(error_of([&] { host_staged(s); }).find("needs a host (MPI) communicator"),
            std::string::npos);
  // The checks of every communicator still apply (a count that does not divide).
  Tensor out = zeros({3}), in = zeros({3 * s->size() + 1});
  EXPECT_NE(error_of([&] { s->reduce_scatter(out, in); }).find("reduce_scatter"),
            std::string::npos);
}

// On a GPU: CUDA tensors through host staging equal the CPU results (all ranks on the device
// of their local rank; the lent machine has one GPU that every rank shares).
TEST(HostStaged, CudaTensorsEqualHostResults) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the CPU stand-in tests cover staging";
  const CommPtr w = world();
  const CommPtr s = host_staged(w);
  const Device dev(DeviceType::CUDA, w->rank() % cuda_device_count());
  const auto want = every_collective(w, kCPU, false);
  for (bool async : {false, true}) {
    const auto got = every_collective(s, dev, async);
    for (size_t k = 0; k < want.size(); ++k)
      EXPECT_TRUE(same_bytes(got[k], want[k])) << "operation " << k << " async " << async;
  }
}

// Property: ranks_sharing_a_device names the first two ranks (in rank order) of one host that
// pass the same device, and nothing when the devices differ (all ranks of these tests run on one
// host). It decides NCCL or host staging for the trainer's GPU ranks (--gpu-comm auto).
TEST(HostStaged, RanksSharingADevice) {
  const CommPtr w = world();
  const int P = w->size(), r = w->rank();
  EXPECT_EQ(ranks_sharing_a_device(w, r), std::nullopt);  // one device per rank
  const auto all_on_0 = ranks_sharing_a_device(w, 0);
  ASSERT_TRUE(all_on_0.has_value());
  EXPECT_EQ(*all_on_0, (std::pair{0, 1}));
  if (P >= 4) {  // devices 0, 1, 0, 1: ranks 0 and 2 share the first
    const auto pairs = ranks_sharing_a_device(w, r % 2);
    ASSERT_TRUE(pairs.has_value());
    EXPECT_EQ(*pairs, (std::pair{0, 2}));
  }
}

}  // namespace
}  // namespace td::distributed
