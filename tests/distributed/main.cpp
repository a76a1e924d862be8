// The main of the multi-rank suites (run under mpirun): initializes MPI through td, lets rank 0
// print the usual gtest output and every other rank print only its failures, prefixed with its
// rank, ends the job at the first test that fails on any rank (Note [Fail fast]), and returns
// the job's verdict on every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "tardelli/distributed/communicator.h"
#include "tardelli/ops/factory.h"

namespace {

namespace dist = td::distributed;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (current_test_info() would deadlock inside OnTestPartResult: gtest holds its lock there.)
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_;
};

// Note [Fail fast]: a test that fails on some rank may leave the ranks out of step (one still
// inside a collective that the others abandoned), and every later test would then wait out its
// timeout. So after each test the ranks compare verdicts over their own communicator (a
// separate MPI context, untouched by the tests' collectives): all passed -> go on; any failed,
// or a rank does not arrive in time -> rank 0 names the test and the failed ranks and the job
// ends (abort_world), skipping the remaining tests.
class FailFast : public ::testing::EmptyTestEventListener {
 public:
  explicit FailFast(dist::CommPtr sync) : sync_(std::move(sync)) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int me = sync_->rank(), n = sync_->size();
    td::Tensor flags = td::zeros({n}, {td::DType::Int32});
    td::Tensor mine = td::full({1}, info.result()->Failed() ? 1 : 0, {td::DType::Int32});
    try {
      sync_->all_gather(flags, mine);
    } catch (const td::Error& e) {
      std::fprintf(stderr, "[rank %d] after %s.%s the ranks are out of step: %s\n", me,
                   info.test_suite_name(), info.name(), e.what());
      dist::abort_world(1);
    }
    std::string failed;
    for (int r = 0; r < n; ++r) {
      if (flags.data_ptr<int32_t>()[r] != 0) failed.append(" ").append(std::to_string(r));
    }
    if (failed.empty()) return;
    if (me == 0) {
      std::fprintf(stderr,
                   "%s.%s failed on rank(s)%s; ending the job, since the ranks may be out of "
                   "step (Note [Fail fast] in tests/distributed/main.cpp)\n",
                   info.test_suite_name(), info.name(), failed.c_str());
      std::fflush(stderr);
    }
    sync_->barrier();  // let rank 0 print first
    dist::abort_world(1);
  }

 private:
  dist::CommPtr sync_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dist::CommPtr world = dist::mpi_world();
  const int rank = world->rank();
  // Longer than any test's collective timeout, so a slow rank still arrives.
  dist::CommPtr sync = world->split(0, rank, "gtest");
  sync->set_timeout(world->options().timeout + std::chrono::seconds(30));
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));  // gtest owns listeners
  }
  listeners.Append(new FailFast(sync));
  int rc = RUN_ALL_TESTS();
  // Every rank returns the job's verdict, so rank 0's summary is the whole story.
  td::Tensor failed = td::full({1}, rc != 0 ? 1 : 0, {td::DType::Int32});
  sync->all_reduce(failed, dist::ReduceOp::Max);
  int any_failed = failed.item<int32_t>();
  sync.reset();
  world.reset();
  dist::finalize();
  return any_failed ? 1 : 0;
}
