// The NCCL communicator (src/distributed/nccl_communicator.cpp) where a GPU is present; every
// case skips with its reason elsewhere.
//
// OneRankGroupsOnEachProcess: NCCL refuses two ranks of one communicator on one device, so on a
// one-GPU machine each process makes a one-rank NCCL communicator of its own (a split of the
// world by rank): every collective on CUDA tensors leaves a one-rank group's data as the
// definition says (sum / max of one value, gather of one part...), host tensors go over MPI
// (Note [Host tensors on a NCCL communicator]) and mixing devices is an error.
// TaggedSendRecvAcrossGpus: with a GPU per rank, messages received in the reverse of their send
// order arrive by tag (Note [NCCL point-to-point]), both directions at once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tardelli/core/cuda_runtime.h"
#include "tardelli/distributed/communicator.h"
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

Tensor values(int rank, int64_t n, double base) {
  return add(arange(0, static_cast<double>(n), 1, {DType::Float32}), base + 100.0 * rank);
}

TEST(NcclCommunicator, OneRankGroupsOnEachProcess) {
  CommPtr solo = world()->split(world()->rank(), 0, "solo");  // collective: before any skip
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  CommPtr c = nccl_communicator(solo, 0);
  EXPECT_STREQ(c->backend(), "nccl");
  const int r = world()->rank();
  const Device gpu = cuda_device(0);
  Tensor x = values(r, 1000, 0.5).to(gpu);
  c->all_reduce(x, ReduceOp::Sum);
  EXPECT_TRUE(same_bytes(x.to(kCPU), values(r, 1000, 0.5)));
  c->all_reduce(x, ReduceOp::Max, true)->wait();
  EXPECT_TRUE(same_bytes(x.to(kCPU), values(r, 1000, 0.5)));
  Tensor out = zeros({37}, {DType::Float32, gpu});
  c->all_gather(out, values(r, 37, 1.0).to(gpu));
  EXPECT_TRUE(same_bytes(out.to(kCPU), values(r, 37, 1.0)));
  c->reduce_scatter(out, values(r, 37, 2.0).to(gpu));
  EXPECT_TRUE(same_bytes(out.to(kCPU), values(r, 37, 2.0)));
  Tensor b = values(r, 5, 3.0).to(gpu);
  c->broadcast(b, 0);
  EXPECT_TRUE(same_bytes(b.to(kCPU), values(r, 5, 3.0)));
  Tensor a2a = zeros({12}, {DType::Float32, gpu});
  c->all_to_all(a2a, values(r, 12, 4.0).to(gpu));
  EXPECT_TRUE(same_bytes(a2a.to(kCPU), values(r, 12, 4.0)));
  c->barrier();
  // Host tensors take the MPI communicator the NCCL one was made from.
  Tensor h = values(r, 9, 5.0);
  c->all_reduce(h, ReduceOp::Sum);
  EXPECT_TRUE(same_bytes(h, values(r, 9, 5.0)));
  Tensor mixed = zeros({9});
  const std::string e = error_of([&] { c->all_gather(mixed, values(r, 9, 0).to(gpu)); });
  EXPECT_NE(e.find("all on the CPU or all on cuda:0"), std::string::npos) << e;
  // Sub-groups of a NCCL communicator are NCCL communicators.
  CommPtr sub = c->split(0, 0, "sub");
  ASSERT_NE(sub, nullptr);
  EXPECT_STREQ(sub->backend(), "nccl");
  Tensor y = values(r, 4, 6.0).to(gpu);
  sub->all_reduce(y);
  EXPECT_TRUE(same_bytes(y.to(kCPU), values(r, 4, 6.0)));
}

TEST(NcclCommunicator, TaggedSendRecvAcrossGpus) {
  const int P = world()->size(), r = world()->rank();
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (cuda_device_count() < P) {
    GTEST_SKIP() << "needs a GPU per rank (" << P << " ranks, " << cuda_device_count()
                 << " GPUs): NCCL refuses two ranks on one device";
  }
  CommPtr c = nccl_communicator(world(), r);
  const Device gpu = cuda_device(r);
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  constexpr int kMessages = 6;
  std::vector<WorkPtr> sends;
  for (int tag = 0; tag < kMessages; ++tag) {
    sends.push_back(c->send(values(r, 100 + tag, tag).to(gpu), next, tag, true));
    sends.push_back(c->send(values(r, 50 + tag, -tag).to(gpu), prev, 100 + tag, true));
  }
  for (int tag = kMessages - 1; tag >= 0; --tag) {
    Tensor a = empty({100 + tag}, {DType::Float32, gpu});
    c->recv(a, prev, tag);
    EXPECT_TRUE(same_bytes(a.to(kCPU), values(prev, 100 + tag, tag))) << tag;
    Tensor b = empty({50 + tag}, {DType::Float32, gpu});
    c->recv(b, next, 100 + tag);
    EXPECT_TRUE(same_bytes(b.to(kCPU), values(next, 50 + tag, -tag))) << tag;
  }
  for (auto& w : sends) w->wait();
}

}  // namespace
}  // namespace td::distributed
