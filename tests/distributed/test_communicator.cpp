// td::distributed::Communicator (MPI backend), run under mpirun at 2 and 4 ranks.
//
// Every rank can compute every rank's input from (rank, index, seed), so each collective is
// checked against a reference computed locally in double precision. Inputs are small integers,
// so sums over <= 8 ranks are exact in every dtype (bf16 holds integers up to 256 exactly) and
// results are compared for equality; one test uses non-integer bf16 inputs and checks the
// documented rounding bound instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "tardelli/distributed/communicator.h"
#include "tardelli/ops/factory.h"
#include "test_util.h"

namespace td::distributed {
namespace {

using std::chrono::milliseconds;
using td::test::error_of;

CommPtr world() {
  static CommPtr w = mpi_world(CommOptions{std::chrono::seconds(60), true});
  return w;
}

constexpr DType kAllDTypes[] = {DType::Float32, DType::BFloat16, DType::Float16,
                                DType::Int32,   DType::Int64,    DType::Bool};

// Rank r's element i: an integer in [-8, 8] (bool: != 0).
double input_value(int r, int64_t i, int seed) {
  return static_cast<double>((i * 7 + r * 13 + seed * 5) % 17) - 8.0;
}

// `v` converted to dtype and back (bool: != 0; integers: truncation).
double cast_to(DType dt, double v) {
  return TD_DISPATCH_ALL(dt, "cast_to", [&]<typename T>() -> double {
    return static_cast<double>(static_cast<T>(v));
  });
}

Tensor make_input(DType dt, int64_t n, int r, int seed, int64_t offset = 0) {
  Tensor t = empty({n}, {dt});
  TD_DISPATCH_ALL(dt, "make_input", [&]<typename T>() {
    T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(input_value(r, i + offset, seed));
  });
  return t;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(t.numel());
  TD_DISPATCH_ALL(t.dtype(), "values", [&]<typename T>() {
    const T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<double>(p[i]);
  });
  return v;
}

// Reduction of element i over all ranks, as the backend defines it (bool: sum/max = OR,
// min = AND; avg: float(sum) / n rounded to the dtype, integers truncate).
double reduce_ref(DType dt, ReduceOp op, int n, int64_t i, int seed) {
  double acc = cast_to(dt, input_value(0, i, seed));
  for (int r = 1; r < n; ++r) {
    double x = cast_to(dt, input_value(r, i, seed));
    if (op == ReduceOp::Max || (dt == DType::Bool && op == ReduceOp::Sum)) {
      acc = std::max(acc, x);
    } else if (op == ReduceOp::Min) {
      acc = std::min(acc, x);
    } else {
      acc += x;
    }
  }
  if (op == ReduceOp::Avg) {
    if (is_integral(dt)) return std::trunc(acc / n);
    return cast_to(dt, static_cast<double>(static_cast<float>(acc) / static_cast<float>(n)));
  }
  return cast_to(dt, acc);
}

// Counts mismatches and reports the first (a 1M-element EXPECT_EQ would print megabytes).
::testing::AssertionResult same_values(const std::vector<double>& got,
                                       const std::vector<double>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; first at " << first << ": got "
         << got[first] << ", want " << want[first];
}

std::vector<ReduceOp> ops_for(DType dt) {
  if (dt == DType::Bool) return {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
  return {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
}

// Property: all_reduce gives every rank the elementwise reduction of all ranks' inputs, for
// every dtype and reduce op, at sizes 0, 1, odd and large (1M elements for float32 and bf16).
TEST(MpiComm, AllReduceEveryDtypeOpAndSize) {
  CommPtr w = world();
  int seed = 0;
  for (DType dt : kAllDTypes) {
    std::vector<int64_t> sizes = {0, 1, 1001};
    if (dt == DType::Float32 || dt == DType::BFloat16) sizes.push_back(int64_t{1} << 20);
    for (ReduceOp op : ops_for(dt)) {
      for (int64_t n : sizes) {
        ++seed;
        Tensor t = make_input(dt, n, w->rank(), seed);
        EXPECT_EQ(w->all_reduce(t, op), nullptr);
        std::vector<double> want(n);
        for (int64_t i = 0; i < n; ++i) want[i] = reduce_ref(dt, op, w->size(), i, seed);
        EXPECT_TRUE(same_values(values(t), want))
            << dtype_name(dt) << " " << reduce_op_name(op) << " n=" << n;
      }
    }
  }
}

// Property: bf16/f16 reductions of non-integer values stay within the bound of Note
// [Reduced-precision reductions] ((n - 1) roundings of at most u * sum|x|) and every rank ends
// with the same bits.
TEST(MpiComm, ReducedPrecisionSumBoundAndIdenticalOnEveryRank) {
  CommPtr w = world();
  const int n = w->size();
  const int64_t count = 4099;
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    const double u = dt == DType::BFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    auto x = [&](int r, int64_t i) {
      return cast_to(dt, std::sin(0.37 * static_cast<double>(i) + 1.3 * r) * 3.0);
    };
    Tensor t = empty({count}, {dt});
    TD_DISPATCH_FLOATING(dt, "fill", [&]<typename T>() {
      for (int64_t i = 0; i < count; ++i) t.data_ptr<T>()[i] = T(x(w->rank(), i));
    });
    w->all_reduce(t);
    std::vector<double> got = values(t);
    for (int64_t i = 0; i < count; ++i) {
      double sum = 0, abs_sum = 0;
      for (int r = 0; r < n; ++r) {
        sum += x(r, i);
        abs_sum += std::abs(x(r, i));
      }
      // n - 1 combines, each rounding to the 16-bit type (relative error <= u).
      ASSERT_LE(std::abs(got[i] - sum), (n - 1) * u * abs_sum * (1 + u) + 1e-12)
          << dtype_name(dt) << " i=" << i;
    }
    Tensor all = empty({n * count}, {dt});
    w->all_gather(all, t);
    std::vector<double> every = values(all);
    for (int r = 0; r < n; ++r) {
      std::vector<double> chunk(every.begin() + r * count, every.begin() + (r + 1) * count);
      EXPECT_TRUE(same_values(chunk, got)) << dtype_name(dt) << ": rank " << r << " differs";
    }
  }
}

// Property: all_gather puts rank i's input at [i * n, (i + 1) * n) on every rank.
TEST(MpiComm, AllGatherEveryDtypeAndSize) {
  CommPtr w = world();
  int seed = 100;
  for (DType dt : kAllDTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{1} << 18}) {
      ++seed;
      Tensor in = make_input(dt, n, w->rank(), seed);
      Tensor out = full({w->size() * n}, 1, {dt});
      w->all_gather(out, in);
      std::vector<double> want;
      for (int r = 0; r < w->size(); ++r) {
        for (int64_t i = 0; i < n; ++i) want.push_back(cast_to(dt, input_value(r, i, seed)));
      }
      EXPECT_TRUE(same_values(values(out), want)) << dtype_name(dt) << " n=" << n;
    }
  }
}

// Property: reduce_scatter gives rank r the reduction of chunk r of every rank's input.
TEST(MpiComm, ReduceScatterEveryDtypeOpAndSize) {
  CommPtr w = world();
  const int n = w->size();
  int seed = 200;
  for (DType dt : kAllDTypes) {
    for (ReduceOp op : ops_for(dt)) {
      for (int64_t m : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{1} << 16}) {
        ++seed;
        Tensor in = make_input(dt, n * m, w->rank(), seed);
        Tensor out = empty({m}, {dt});
        w->reduce_scatter(out, in, op);
        std::vector<double> want(m);
        for (int64_t i = 0; i < m; ++i) want[i] = reduce_ref(dt, op, n, w->rank() * m + i, seed);
        EXPECT_TRUE(same_values(values(out), want))
            << dtype_name(dt) << " " << reduce_op_name(op) << " m=" << m;
      }
    }
  }
}

// Property: broadcast copies the root's tensor to every rank, from every root.
TEST(MpiComm, BroadcastFromEveryRoot) {
  CommPtr w = world();
  int seed = 300;
  for (DType dt : kAllDTypes) {
    for (int root = 0; root < w->size(); ++root) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}}) {
        ++seed;
        Tensor t = make_input(dt, n, w->rank(), seed);
        w->broadcast(t, root);
        std::vector<double> want(n);
        for (int64_t i = 0; i < n; ++i) want[i] = cast_to(dt, input_value(root, i, seed));
        EXPECT_TRUE(same_values(values(t), want)) << dtype_name(dt) << " root=" << root;
      }
    }
  }
}

// Property: all_to_all with equal and with unequal (including empty) splits delivers rank i's
// slice for rank j to rank j, stored in rank order.
TEST(MpiComm, AllToAllEqualAndUnequalSplits) {
  CommPtr w = world();
  const int n = w->size(), me = w->rank();
  // rank i sends split(i, j) elements to rank j; zero for some pairs.
  auto split = [](int i, int j) -> int64_t { return (i * 3 + j * 5) % 4; };
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Int64, DType::Bool}) {
    // Equal splits: 7 elements per pair.
    Tensor in = make_input(dt, 7 * n, me, 400);
    Tensor out = empty({7 * n}, {dt});
    w->all_to_all(out, in);
    std::vector<double> want;
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < 7; ++i) want.push_back(cast_to(dt, input_value(r, me * 7 + i, 400)));
    }
    EXPECT_TRUE(same_values(values(out), want)) << "equal splits, " << dtype_name(dt);

    // Unequal splits: rank r's input element k is input_value(r, k, 401).
    std::vector<int64_t> in_splits(n), out_splits(n);
    for (int j = 0; j < n; ++j) {
      in_splits[j] = split(me, j);
      out_splits[j] = split(j, me);
    }
    int64_t in_total = 0, out_total = 0;
    for (int j = 0; j < n; ++j) {
      in_total += in_splits[j];
      out_total += out_splits[j];
    }
    Tensor uin = make_input(dt, in_total, me, 401);
    Tensor uout = full({out_total}, 0, {dt});
    w->all_to_all(uout, uin, out_splits, in_splits);
    want.clear();
    for (int r = 0; r < n; ++r) {
      int64_t offset = 0;  // where rank r's slice for me starts in r's input
      for (int j = 0; j < me; ++j) offset += split(r, j);
      for (int64_t i = 0; i < split(r, me); ++i) {
        want.push_back(cast_to(dt, input_value(r, offset + i, 401)));
      }
    }
    EXPECT_TRUE(same_values(values(uout), want)) << "unequal splits, " << dtype_name(dt);
  }
}

// Property: point-to-point messages travel around a ring (async send, blocking recv) with tags
// kept apart, and a receive whose count differs from the message is a td::Error.
TEST(MpiComm, SendRecvRing) {
  CommPtr w = world();
  const int n = w->size(), me = w->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (DType dt : kAllDTypes) {
    Tensor a = make_input(dt, 513, me, 500), b = make_input(dt, 9, me, 501);
    // Tag 2 is sent first but received second: tags must keep them apart.
    WorkPtr sb = w->send(b, next, 2, true);
    WorkPtr sa = w->send(a, next, 1, true);
    Tensor ra = empty({513}, {dt}), rb = empty({9}, {dt});
    w->recv(ra, prev, 1);
    w->recv(rb, prev, 2);
    sa->wait();
    sb->wait();
    std::vector<double> wa(513), wb(9);
    for (int64_t i = 0; i < 513; ++i) wa[i] = cast_to(dt, input_value(prev, i, 500));
    for (int64_t i = 0; i < 9; ++i) wb[i] = cast_to(dt, input_value(prev, i, 501));
    EXPECT_TRUE(same_values(values(ra), wa)) << dtype_name(dt);
    EXPECT_TRUE(same_values(values(rb), wb)) << dtype_name(dt);
  }
  // A message shorter than the receive buffer.
  Tensor shorter = ones({5});
  WorkPtr s = w->send(shorter, next, 3, true);
  Tensor longer = empty({6});
  try {
    w->recv(longer, prev, 3);
    ADD_FAILURE() << "a short message was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sent 5 elements, expected 6"), std::string::npos)
        << e.what();
  }
  s->wait();
}

// Property: split() by parity forms groups ordered by key whose collectives involve only their
// members; a negative color gives nullptr.
TEST(MpiComm, SplitEvenOddAndCollectivesInside) {
  CommPtr w = world();
  const int n = w->size(), me = w->rank();
  // Reverse order inside each group via the key.
  CommPtr sub = w->split(me % 2, n - me, "parity");
  ASSERT_NE(sub, nullptr);
  std::vector<int> members;
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == me % 2) members.push_back(r);
  }
  EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[sub->rank()], me);
  EXPECT_EQ(sub->name(), "parity");
  Tensor t = full({3}, me + 1, {DType::Int64});
  sub->all_reduce(t);
  int64_t want = 0;
  for (int r : members) want += r + 1;
  EXPECT_TRUE(same_values(values(t), std::vector<double>(3, static_cast<double>(want))));
  Tensor g = empty({sub->size()}, {DType::Int32});
  sub->all_gather(g, full({1}, me, {DType::Int32}));
  std::vector<double> wg(members.begin(), members.end());
  EXPECT_TRUE(same_values(values(g), wg));

  // Only rank 0 is in the group "first"; the others get nullptr.
  CommPtr first = w->split(me == 0 ? 0 : -1, 0, "first");
  EXPECT_EQ(first == nullptr, me != 0);
  if (first) {
    EXPECT_EQ(first->size(), 1);
  }
}

// Property: async operations run concurrently and complete without wait(): only the progress
// thread can complete them (is_completed() makes no MPI call, and OpenMPI advances a
// non-blocking collective only inside MPI calls), so this fails without that thread.
TEST(MpiComm, AsyncCompletesWithoutWaitWhileCallerComputes) {
  CommPtr w = world();
  const int64_t n = int64_t{1} << 22;  // 16 MiB of float32
  Tensor t = make_input(DType::Float32, n, w->rank(), 600);
  WorkPtr work = w->all_reduce(t, ReduceOp::Sum, true);
  ASSERT_NE(work, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  volatile double sink = 0;
  while (!work->is_completed() &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    for (int i = 0; i < 100000; ++i) sink = sink + std::sqrt(static_cast<double>(i));  // compute
  }
  EXPECT_TRUE(work->is_completed()) << "the async all_reduce did not progress without wait()";
  work->wait();
  std::vector<double> got = values(t);
  for (int64_t i = 0; i < n; i += 4099) {
    ASSERT_EQ(got[i], reduce_ref(DType::Float32, ReduceOp::Sum, w->size(), i, 600)) << i;
  }
}

// Property: several async operations in flight at once complete correctly, whatever the order
// of the waits.
TEST(MpiComm, ManyAsyncOpsWaitedInReverseOrder) {
  CommPtr w = world();
  const int n = w->size();
  Tensor a = make_input(DType::Float32, 100003, w->rank(), 700);
  Tensor b = make_input(DType::BFloat16, 1001, w->rank(), 701);
  Tensor gin = make_input(DType::Int32, 77, w->rank(), 702);
  Tensor gout = empty({77 * n}, {DType::Int32});
  Tensor c = make_input(DType::Int64, 55, w->rank(), 703);
  std::vector<WorkPtr> works = {w->all_reduce(a, ReduceOp::Avg, true),
                                w->all_reduce(b, ReduceOp::Max, true),
                                w->all_gather(gout, gin, true), w->broadcast(c, n - 1, true)};
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (const WorkPtr& wk : works) EXPECT_TRUE(wk->is_completed());
  std::vector<double> got_a = values(a);
  for (int64_t i = 0; i < 100003; i += 97) {
    ASSERT_EQ(got_a[i], reduce_ref(DType::Float32, ReduceOp::Avg, n, i, 700)) << i;
  }
  std::vector<double> wb(1001);
  for (int64_t i = 0; i < 1001; ++i) wb[i] = reduce_ref(DType::BFloat16, ReduceOp::Max, n, i, 701);
  EXPECT_TRUE(same_values(values(b), wb));
  std::vector<double> wg;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < 77; ++i) wg.push_back(input_value(r, i, 702));
  }
  EXPECT_TRUE(same_values(values(gout), wg));
  std::vector<double> wc(55);
  for (int64_t i = 0; i < 55; ++i) wc[i] = input_value(n - 1, i, 703);
  EXPECT_TRUE(same_values(values(c), wc));
}

// Property: ranks that disagree on the count, dtype, splits or the collective itself get a
// td::Error on EVERY rank listing each rank's values, instead of a hang or corrupted memory;
// the group stays usable.
TEST(MpiComm, MismatchedCountsAndDtypesAreReportedByEveryRank) {
  CommPtr w = world();
  const int me = w->rank();
  Tensor t = ones({10 + me});
  std::string msg = error_of([&] { w->all_reduce(t); });
  EXPECT_NE(msg.find("ranks disagree"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0: all_reduce(sum) of 10 float32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1: all_reduce(sum) of 11 float32"), std::string::npos) << msg;

  Tensor d = ones({4}, {me == 0 ? DType::Float32 : DType::BFloat16});
  msg = error_of([&] { w->broadcast(d, 0); });
  EXPECT_NE(msg.find("rank 0: broadcast(root 0) of 4 float32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1: broadcast(root 0) of 4 bfloat16"), std::string::npos) << msg;

  // all_to_all: rank 0 expects one element more from rank 1 than rank 1 sends.
  const int n = w->size();
  std::vector<int64_t> in_splits(n, 2), out_splits(n, 2);
  if (me == 0) out_splits[1] = 3;
  Tensor in = ones({2 * n}), out = empty({2 * n + (me == 0 ? 1 : 0)});
  msg = error_of([&] { w->all_to_all(out, in, out_splits, in_splits); });
  EXPECT_NE(msg.find("rank 1 sends 2 elements to rank 0, which expects 3"), std::string::npos)
      << msg;

  // Different collectives: rank 0 all_reduce, the others all_to_all.
  Tensor x = ones({2 * n}), y = empty({2 * n});
  msg = error_of([&] {
    if (me == 0) {
      w->all_reduce(x);
    } else {
      w->all_to_all(y, x);
    }
  });
  EXPECT_NE(msg.find("rank 0: all_reduce(sum) of " + std::to_string(2 * n) + " float32"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rank 1: all_to_all of float32"), std::string::npos) << msg;

  // The group still works.
  Tensor ok = ones({3});
  w->all_reduce(ok);
  EXPECT_EQ(values(ok), std::vector<double>(3, n));
}

// Property: a wait that outlives the timeout throws a td::Error naming rank, group, op and
// count; the operation stays pending, so when the late ranks join it completes and a second
// wait() succeeds with the right values (the group recovers).
TEST(MpiComm, TimeoutNamesTheOperationAndLateJoinRecovers) {
  CommPtr w = mpi_world(CommOptions{std::chrono::seconds(2), /*check_consistency=*/false});
  const int n = w->size();
  Tensor t = make_input(DType::Float32, 1000, w->rank(), 800);
  if (w->rank() == 0) {
    WorkPtr work = w->all_reduce(t, ReduceOp::Sum, true);
    auto t0 = std::chrono::steady_clock::now();
    std::string msg = error_of([&] { work->wait(); });
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string want = "rank 0 of group 'world' (size " + std::to_string(n) +
                       "): all_reduce(sum) of 1000 float32 timed out after 2 s";
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_GE(waited, 1.9);
    EXPECT_LT(waited, 3.0);
    EXPECT_FALSE(work->is_completed());
    work->wait();  // the others join ~0.8 s later
  } else {
    std::this_thread::sleep_for(milliseconds(2800));
    w->all_reduce(t);
  }
  std::vector<double> want(1000);
  for (int64_t i = 0; i < 1000; ++i) want[i] = reduce_ref(DType::Float32, ReduceOp::Sum, n, i, 800);
  EXPECT_TRUE(same_values(values(t), want));
  world()->barrier();
}

// Property: bad arguments are td::Errors naming the op and the group, raised before any
// communication (so no rank hangs).
TEST(MpiComm, BadArgumentsRaiseLocally) {
  CommPtr w = world();
  const int n = w->size();
  Tensor m = ones({4, 6});
  Tensor nc = m.transpose(0, 1);
  std::string msg = error_of([&] { w->all_reduce(nc); });
  EXPECT_NE(msg.find("all_reduce (rank " + std::to_string(w->rank()) + " of group 'world'"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("contiguous"), std::string::npos) << msg;
  Tensor out = empty({3});
  msg = error_of([&] { w->all_gather(out, ones({2})); });
  EXPECT_NE(msg.find("size() * in.numel()"), std::string::npos) << msg;
  msg = error_of([&] { w->all_gather(out, ones({3}, {DType::Int32})); });
  EXPECT_NE(msg.find("same dtype"), std::string::npos) << msg;
  msg = error_of([&] { w->reduce_scatter(out, ones({3 * n + 1})); });
  EXPECT_NE(msg.find("size() * out.numel()"), std::string::npos) << msg;
  Tensor b = ones({2}, {DType::Bool});
  msg = error_of([&] { w->all_reduce(b, ReduceOp::Avg); });
  EXPECT_NE(msg.find("avg is not defined for bool"), std::string::npos) << msg;
  msg = error_of([&] { w->broadcast(out, n); });
  EXPECT_NE(msg.find("root " + std::to_string(n) + " is out of range"), std::string::npos) << msg;
  msg = error_of([&] { w->send(out, w->rank()); });
  EXPECT_NE(msg.find("cannot send to itself"), std::string::npos) << msg;
  msg = error_of([&] { w->recv(out, -1); });
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  msg = error_of([&] { w->all_to_all(out, ones({3}), {1}, {}); });
  EXPECT_NE(msg.find("out_splits has 1 entries"), std::string::npos) << msg;
  Tensor o2 = empty({2 * n});
  std::vector<int64_t> bad(n, 2);
  bad[0] = 3;
  msg = error_of([&] { w->all_to_all(o2, ones({2 * n}), {}, bad); });
  EXPECT_NE(msg.find("in_splits sum to " + std::to_string(2 * n + 1)), std::string::npos) << msg;
  msg = error_of([&] { w->all_gather(o2, o2.narrow(0, 0, 2)); });
  EXPECT_NE(msg.find("must not share storage"), std::string::npos) << msg;
  EXPECT_EQ(std::string(w->backend()), "mpi");
  EXPECT_TRUE(mpi_available());
  // A CPU build has no NCCL; a CUDA build rejects device -1 before any communication.
  EXPECT_THROW(nccl_communicator(w, -1), Error);
}

// Property: reduce-op names round-trip; TD_COMM_TIMEOUT_S overrides the default timeout and a
// malformed value is an error.
TEST(MpiComm, ReduceOpNamesAndTimeoutEnvironment) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    EXPECT_EQ(parse_reduce_op(reduce_op_name(op)), op);
  }
  EXPECT_THROW(parse_reduce_op("prod"), Error);
  const char* old = std::getenv("TD_COMM_TIMEOUT_S");
  std::string saved = old ? old : "";
  setenv("TD_COMM_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(default_comm_timeout(), milliseconds(2500));
  EXPECT_EQ(CommOptions{}.timeout, milliseconds(2500));
  setenv("TD_COMM_TIMEOUT_S", "soon", 1);
  EXPECT_THROW(default_comm_timeout(), Error);
  unsetenv("TD_COMM_TIMEOUT_S");
  EXPECT_EQ(default_comm_timeout(), std::chrono::minutes(5));
  if (old) setenv("TD_COMM_TIMEOUT_S", saved.c_str(), 1);
}

// Property (Note [Communication accounting]): stats() counts each operation once with its input
// bytes, exactly, per communicator (a sub-group's traffic is not the world's); arguments rejected
// before communicating are not counted; the blocked seconds are >= 0, grow with every counted
// operation (waits on another thread included) and never exceed the wall time that passed,
// since only this thread blocks; reset_stats() zeroes everything.
TEST(MpiComm, StatsCountCallsBytesAndBlockedSeconds) {
  CommPtr w = world();
  const int n = w->size(), me = w->rank();
  CommPtr g = w->split(0, me, "stats");
  ASSERT_NE(g, nullptr);
  const CommStats world_before = w->stats();
  CommStats s = g->stats();
  EXPECT_EQ(s.calls, 0);
  EXPECT_EQ(s.bytes, 0);
  EXPECT_EQ(s.seconds, 0.0);

  const auto t0 = std::chrono::steady_clock::now();
  int64_t calls = 0, bytes = 0;
  double seconds = 0.0;
  // After each operation: the exact counts, and seconds that did not decrease.
  auto expect_counts = [&](const char* what) {
    const CommStats now = g->stats();
    EXPECT_EQ(now.calls, calls) << what;
    EXPECT_EQ(now.bytes, bytes) << what;
    EXPECT_GE(now.seconds, seconds) << what;
    seconds = now.seconds;
  };
  Tensor a = make_input(DType::Float32, 1000, me, 800);
  g->all_reduce(a);
  calls += 1, bytes += 4000;
  expect_counts("all_reduce");
  Tensor gin = make_input(DType::Int64, 10, me, 801), gout = empty({10 * n}, {DType::Int64});
  g->all_gather(gout, gin);
  calls += 1, bytes += 80;  // this rank's part only
  expect_counts("all_gather");
  Tensor rin = make_input(DType::BFloat16, 6 * n, me, 802), rout = empty({6}, {DType::BFloat16});
  g->reduce_scatter(rout, rin);
  calls += 1, bytes += 12 * n;
  expect_counts("reduce_scatter");
  Tensor b = make_input(DType::Int32, 7, me, 803);
  g->broadcast(b, 0);
  calls += 1, bytes += 28;
  expect_counts("broadcast");
  Tensor ain = make_input(DType::Float32, 4 * n, me, 804), aout = empty({4 * n});
  g->all_to_all(aout, ain);
  calls += 1, bytes += 16 * n;
  expect_counts("all_to_all");
  // A ring: receive from the left (async), send to the right, wait.
  Tensor sendbuf = make_input(DType::Float32, 5, me, 805), recvbuf = empty({5});
  WorkPtr rw = g->recv(recvbuf, (me + n - 1) % n, 3, true);
  g->send(sendbuf, (me + 1) % n, 3);
  rw->wait();
  calls += 2, bytes += 40;
  expect_counts("send/recv");
  g->barrier();
  calls += 1;
  expect_counts("barrier");
  // Rejected before communicating: not counted.
  Tensor strided = zeros({4, 4}).t();
  EXPECT_THROW(g->all_reduce(strided), Error);
  expect_counts("rejected all_reduce");
  // Async, waited on another thread: counted once, its wait adds to the seconds.
  Tensor big = make_input(DType::Float32, int64_t{1} << 18, me, 806);
  WorkPtr work = g->all_reduce(big, ReduceOp::Sum, true);
  ASSERT_NE(work, nullptr);
  std::thread waiter([&] { work->wait(); });
  waiter.join();
  EXPECT_TRUE(work->is_completed());
  calls += 1, bytes += 4 << 18;
  expect_counts("async all_reduce");
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(seconds, 0.0);
  EXPECT_LE(seconds, wall);
  // The world communicator saw none of it.
  const CommStats world_after = w->stats();
  EXPECT_EQ(world_after.calls, world_before.calls);
  EXPECT_EQ(world_after.bytes, world_before.bytes);

  g->reset_stats();
  s = g->stats();
  EXPECT_EQ(s.calls, 0);
  EXPECT_EQ(s.bytes, 0);
  EXPECT_EQ(s.seconds, 0.0);
  g->all_reduce(a, ReduceOp::Max);
  EXPECT_EQ(g->stats().calls, 1);
  EXPECT_EQ(g->stats().bytes, 4000);
}

}  // namespace
}  // namespace td::distributed
