// Tag matching over an ordered transport (include/tardelli/distributed/tag_matching.h), through
// its MPI stand-in, at 2 and 4 ranks.
//
// Property: a TagMatcher gives MPI's tag semantics although its transport pairs messages only by
// order. Every message carries a payload unique to (sender, tag) and a length of its own, so a
// wrongly paired message shows as wrong values (or a count error), never as a pass. Cases:
// receives posted in the reverse of the send order (every message unexpected), receives posted
// before the sends (every message matched to a posted receive), both directions at once (no
// receive blocks a send), repeated tags matching in order, and a count mismatch reported with
// both counts. The pipeline schedules' own traffic goes through the same matcher in
// test_pipeline_runtime.cpp (TagMatchedPipeline).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tardelli/distributed/tag_matching.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "test_util.h"

namespace td::distributed {
namespace {

using td::test::error_of;

CommPtr world() {
  static CommPtr w = mpi_world();
  return w;
}

CommPtr matched() {
  static CommPtr m = tag_matched_mpi(world());
  return m;
}

// The message `src` sends with `tag` (its length depends on the tag).
Tensor payload(int src, int tag, int64_t extra = 0) {
  const int64_t n = 3 + tag % 7 + extra;
  return add(arange(0, static_cast<double>(n), 1, {DType::Float32}), 1000.0 * src + tag);
}

TEST(TagMatching, ReceivesInReverseOrderMatchByTag) {
  CommPtr c = matched();
  const int P = c->size(), r = c->rank();
  const int to = (r + 1) % P, from = (r + P - 1) % P;
  constexpr int kMessages = 12;
  std::vector<WorkPtr> sends;
  for (int tag = 0; tag < kMessages; ++tag) {
    sends.push_back(c->send(payload(r, tag), to, tag, /*async_op=*/true));
  }
  for (int tag = kMessages - 1; tag >= 0; --tag) {
    Tensor got = empty({payload(from, tag).numel()});
    c->recv(got, from, tag);
    EXPECT_TRUE(td::test::same_bytes(got, payload(from, tag))) << "tag " << tag;
  }
  for (auto& w : sends) w->wait();
}

TEST(TagMatching, ReceivesPostedBeforeTheSendsMatchByTag) {
  CommPtr c = matched();
  const int P = c->size(), r = c->rank();
  const int to = (r + 1) % P, from = (r + P - 1) % P;
  constexpr int kMessages = 9;
  std::vector<Tensor> got;
  std::vector<WorkPtr> recvs;
  for (int tag = 0; tag < kMessages; ++tag) {
    got.push_back(empty({payload(from, tag).numel()}));
    recvs.push_back(c->recv(got.back(), from, tag, /*async_op=*/true));
  }
  world()->barrier();  // every receive is posted before any send
  std::vector<WorkPtr> sends;
  for (int tag = kMessages - 1; tag >= 0; tag -= 2) {  // odd order: 8, 6, ..., then 7, 5, ...
    sends.push_back(c->send(payload(r, tag), to, tag, true));
  }
  for (int tag = kMessages - 2; tag >= 0; tag -= 2)
    sends.push_back(c->send(payload(r, tag), to, tag, true));
  for (int tag = 0; tag < kMessages; ++tag) {
    recvs[tag]->wait();
    EXPECT_TRUE(td::test::same_bytes(got[tag], payload(from, tag))) << "tag " << tag;
  }
  for (auto& w : sends) w->wait();
}

TEST(TagMatching, BothDirectionsAtOnceAndRepeatedTags) {
  CommPtr c = matched();
  const int P = c->size(), r = c->rank();
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  // Large enough that a transport without buffering could not complete a send before its
  // receive; each rank sends to both neighbours before receiving from either.
  constexpr int64_t kBig = 1 << 18;
  std::vector<WorkPtr> sends;
  for (int k = 0; k < 3; ++k) {  // tag 5 three times each way: matched in order
    sends.push_back(c->send(payload(r, 5, kBig + k), next, 5, true));
    sends.push_back(c->send(payload(r, 6, k), prev, 6, true));
  }
  for (int k = 0; k < 3; ++k) {
    Tensor a = empty({payload(prev, 5, kBig + k).numel()});
    c->recv(a, prev, 5);
    EXPECT_TRUE(td::test::same_bytes(a, payload(prev, 5, kBig + k))) << k;
    Tensor b = empty({payload(next, 6, k).numel()});
    c->recv(b, next, 6);
    EXPECT_TRUE(td::test::same_bytes(b, payload(next, 6, k))) << k;
  }
  for (auto& w : sends) w->wait();
}

TEST(TagMatching, CountMismatchNamesBothCounts) {
  CommPtr c = matched();
  const int P = c->size(), r = c->rank();
  const int to = (r + 1) % P, from = (r + P - 1) % P;
  // A posted receive that is too short, then an unexpected one.
  Tensor shortbuf = empty({2});
  WorkPtr posted = c->recv(shortbuf, from, 40, true);
  world()->barrier();
  WorkPtr s1 = c->send(payload(r, 40), to, 40, true);
  const std::string e1 = error_of([&] { posted->wait(); });
  EXPECT_NE(e1.find("recv of 2 float32 from rank " + std::to_string(from) + " (tag 40)"),
            std::string::npos)
      << e1;
  EXPECT_NE(e1.find("the sender sent " + std::to_string(payload(from, 40).numel()) + " float32"),
            std::string::npos)
      << e1;
  s1->wait();
  WorkPtr s2 = c->send(payload(r, 41), to, 41, true);
  s2->wait();
  world()->barrier();  // the message has arrived: the receive below finds it unexpected
  Tensor wrong = empty({1}, {DType::Int64});
  const std::string e2 = error_of([&] { c->recv(wrong, from, 41); });
  EXPECT_NE(e2.find("the sender sent " + std::to_string(payload(from, 41).numel()) + " float32"),
            std::string::npos)
      << e2;
  // The matcher still works afterwards.
  WorkPtr s3 = c->send(payload(r, 42), to, 42, true);
  Tensor ok = empty({payload(from, 42).numel()});
  c->recv(ok, from, 42);
  EXPECT_TRUE(td::test::same_bytes(ok, payload(from, 42)));
  s3->wait();
}

TEST(TagMatching, SplitGroupsMatchTooAndCollectivesPassThrough) {
  CommPtr c = matched();
  const int r = c->rank();
  CommPtr pair = c->split(r / 2, r, "pair");
  ASSERT_NE(pair, nullptr);
  EXPECT_STREQ(pair->backend(), "mpi-tag-matched");
  Tensor s = full({1}, static_cast<double>(r), {DType::Float32});
  pair->all_reduce(s);
  if (pair->size() == 2) {
    const int peer = 1 - pair->rank();
    WorkPtr w = pair->send(payload(pair->rank(), 3), peer, 3, true);
    Tensor got = empty({payload(peer, 3).numel()});
    pair->recv(got, peer, 3);
    EXPECT_TRUE(td::test::same_bytes(got, payload(peer, 3)));
    w->wait();
  }
  const double lo = 2.0 * (r / 2);
  EXPECT_EQ(s.item_double(), pair->size() == 2 ? lo + lo + 1 : lo);
}

}  // namespace
}  // namespace td::distributed
