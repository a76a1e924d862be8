// RngTracker (include/tardelli/parallel/rng_tracker.h), single process: Megatron's seeds, the
// named-stream API, and the checkpoint state round trip. (Across tp ranks:
// tests/distributed/test_tensor_parallel.cpp, RngTrackerStreamsAcrossRanks.)
#include <gtest/gtest.h>

#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/ops/dropout.h"
#include "tardelli/ops/factory.h"
#include "tardelli/parallel/rng_tracker.h"

namespace td::parallel {
namespace {

std::vector<float> draw(Generator& g, int64_t n = 16) {
  return to_vector<float>(rand({n}, {}, &g));
}

// model_parallel(seed, r): default = seed, model-parallel = seed + 2718 + r (Megatron), each
// drawing exactly what a plain Generator with that seed draws.
TEST(RngTracker, ModelParallelSeeds) {
  for (int r : {0, 1, 3}) {
    RngTracker t = RngTracker::model_parallel(42, r);
    EXPECT_EQ(t.names(), (std::vector<std::string>{kDefaultRng, kModelParallelRng}));
    EXPECT_EQ(t.get(kDefaultRng).seed(), 42u);
    EXPECT_EQ(t.get(kModelParallelRng).seed(), 42u + 2718u + static_cast<uint64_t>(r));
    Generator ref_default(42), ref_mp(42 + 2718 + r);
    EXPECT_EQ(draw(t.get(kDefaultRng)), draw(ref_default));
    EXPECT_EQ(draw(t.get(kModelParallelRng)), draw(ref_mp));
  }
  EXPECT_THROW(RngTracker::model_parallel(42, -1), Error);
}

// fork(name) is the generator get(name) returns: a dropout through it advances that stream and
// no other.
TEST(RngTracker, ForkAdvancesOnlyItsStream) {
  RngTracker t = RngTracker::model_parallel(7, 0);
  EXPECT_EQ(t.fork(kModelParallelRng), &t.get(kModelParallelRng));
  const uint64_t before_default = t.get(kDefaultRng).offset();
  const uint64_t before_mp = t.get(kModelParallelRng).offset();
  dropout(ones({100}), 0.1, true, t.fork(kModelParallelRng));
  EXPECT_EQ(t.get(kDefaultRng).offset(), before_default);
  EXPECT_GT(t.get(kModelParallelRng).offset(), before_mp);
}

// add: duplicate names and a (seed, subsequence) already in use are errors; get of an unknown
// name names the known ones.
TEST(RngTracker, AddAndGetErrors) {
  RngTracker t;
  t.add("a", 1);
  t.add("b", 1, 5);  // same seed, another subsequence: independent
  EXPECT_TRUE(t.has("a"));
  EXPECT_FALSE(t.has("c"));
  EXPECT_THROW(t.add("a", 2), Error);
  EXPECT_THROW(t.add("c", 1), Error);
  EXPECT_THROW(t.add("", 3), Error);
  try {
    t.get("missing");
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a', 'b'"), std::string::npos) << e.what();
  }
  t.reset();
  EXPECT_TRUE(t.names().empty());
}

// states() then set_states() restores every stream: the draws after the restore repeat the
// draws after the save, bitwise, for all streams (seed, offset and subsequence).
TEST(RngTracker, StateRoundTrip) {
  RngTracker t = RngTracker::model_parallel(99, 2);
  t.add("extra", 5, 3);
  draw(t.get(kDefaultRng), 10);
  draw(t.get("extra"), 7);
  const auto saved = t.states();
  EXPECT_EQ(saved.at("extra").subsequence, 3u);
  EXPECT_EQ(saved.at(kModelParallelRng).seed, 99u + 2718u + 2u);
  std::vector<std::vector<float>> first;
  for (const std::string& name : t.names()) first.push_back(draw(t.get(name)));

  // A fresh tracker with the same names (other seeds) restored from the saved states.
  RngTracker u = RngTracker::model_parallel(1, 0);
  u.add("extra", 6);
  u.set_states(saved);
  std::vector<std::vector<float>> again;
  for (const std::string& name : u.names()) again.push_back(draw(u.get(name)));
  EXPECT_EQ(first, again);
  EXPECT_EQ(u.states().at("extra").subsequence, 3u);

  // Missing or unknown names are an error, and leave the tracker unchanged.
  auto partial = saved;
  partial.erase("extra");
  EXPECT_THROW(u.set_states(partial), Error);
  auto unknown = saved;
  unknown["other"] = PhiloxState{};
  EXPECT_THROW(u.set_states(unknown), Error);
}

}  // namespace
}  // namespace td::parallel
