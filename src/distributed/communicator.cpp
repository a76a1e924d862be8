// The backend-independent half of td::distributed::Communicator: argument checks with messages
// that name the op, the group, the rank, shapes and dtypes; then the backend's do_* method.
#include "tardelli/distributed/communicator.h"

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <utility>

namespace td::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "avg") return ReduceOp::Avg;
  if (s == "max") return ReduceOp::Max;
  if (s == "min") return ReduceOp::Min;
  TD_ERROR("parse_reduce_op: unknown reduce op '", s, "' (expected sum, avg, max or min)");
}

std::chrono::milliseconds default_comm_timeout() {
  const char* env = std::getenv("TD_COMM_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return std::chrono::minutes(5);
  char* end = nullptr;
  double s = std::strtod(env, &end);
  TD_CHECK(end != env && *end == '\0' && std::isfinite(s) && s > 0, "TD_COMM_TIMEOUT_S='", env,
           "' is not a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(s * 1000.0)));
}

std::string Communicator::where() const {
  return detail::str_cat("rank ", rank_, " of group '", name_, "' (size ", size_, ")");
}

// Note [Communication accounting]: every public operation of a communicator adds to its own
// counters one call, its input bytes (a benchmark divides them by the step count; the bytes a
// backend puts on the wire depend on its algorithm, so we count what the caller handed over),
// and the seconds the CALLING thread was blocked: the whole blocking call (its consistency check
// included), or for async_op the issue plus the time spent inside Work::wait(). That is the
// exposed communication time; an async operation that completes while the caller computes
// costs only its issue. The counters are atomics shared with the Works (the progress thread
// never touches them: only callers of wait() do, from whatever thread), so stats() may be read
// while operations are in flight. The check_consistency all-gathers are part of the operation
// they guard, not counted as calls of their own; split() is not counted.
namespace {

using Clock = std::chrono::steady_clock;

void add_time(comm_detail::CommCounters& c, Clock::time_point since) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since);
  c.nanoseconds.fetch_add(ns.count(), std::memory_order_relaxed);
}

// A Work whose wait() counts the caller's blocked time (failures and timeouts included).
class CountedWork final : public Work {
 public:
  CountedWork(WorkPtr inner, std::shared_ptr<comm_detail::CommCounters> counters)
      : inner_(std::move(inner)), counters_(std::move(counters)) {}
  void wait() override {
    const Clock::time_point t0 = Clock::now();
    try {
      inner_->wait();
    } catch (...) {
      add_time(*counters_, t0);
      throw;
    }
    add_time(*counters_, t0);
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<comm_detail::CommCounters> counters_;
};

}  // namespace

template <typename F>
WorkPtr Communicator::counted(size_t bytes, F&& issue) {
  const Clock::time_point t0 = Clock::now();
  WorkPtr work;
  try {
    work = issue();
  } catch (...) {
    add_time(*counters_, t0);
    throw;
  }
  add_time(*counters_, t0);
  counters_->calls.fetch_add(1, std::memory_order_relaxed);
  counters_->bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  if (work == nullptr) return work;
  return std::make_shared<CountedWork>(std::move(work), counters_);
}

CommStats Communicator::stats() const {
  CommStats s;
  s.calls = counters_->calls.load(std::memory_order_relaxed);
  s.bytes = counters_->bytes.load(std::memory_order_relaxed);
  s.seconds = static_cast<double>(counters_->nanoseconds.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

void Communicator::reset_stats() {
  counters_->calls.store(0, std::memory_order_relaxed);
  counters_->bytes.store(0, std::memory_order_relaxed);
  counters_->nanoseconds.store(0, std::memory_order_relaxed);
}

namespace {

// The MPI backend moves CPU tensors, the NCCL backend CUDA tensors, the host-staged one both
// (host_staged.h).
void check_tensor(const Communicator& c, const Tensor& t, const char* op, const char* arg) {
  TD_CHECK(t.defined(), op, " (", c.where(), "): argument '", arg, "' is an undefined tensor");
  const std::string backend = c.backend();
  if (backend != "mpi-staged") {
    const bool want_cuda = backend == "nccl";
    TD_CHECK(want_cuda ? t.is_cuda() : t.is_cpu(), op, " (", c.where(), "): the ", backend,
             " backend takes ", want_cuda ? "CUDA" : "CPU", " tensors, got '", arg, "' ",
             describe(t), backend == "mpi" ? " (host_staged() moves CUDA tensors over MPI)" : "");
  }
  TD_CHECK(t.is_contiguous(), op, " (", c.where(), "): argument '", arg,
           "' must be contiguous, got ", describe(t), " with strides ", shape_str(t.strides()),
           " (call .contiguous() first)");
}

void check_same_dtype(const Communicator& c, const Tensor& out, const Tensor& in, const char* op) {
  TD_CHECK(out.dtype() == in.dtype(), op, " (", c.where(),
           "): out and in must have the same dtype, got ", describe(out), " and ", describe(in));
}

void check_disjoint(const Communicator& c, const Tensor& out, const Tensor& in, const char* op) {
  TD_CHECK(!out.shares_storage(in), op, " (", c.where(),
           "): out and in must not share storage (in-place is not supported), got ", describe(out),
           " and ", describe(in));
}

void check_reduce_op(const Communicator& c, const Tensor& t, ReduceOp rop, const char* op) {
  TD_CHECK(!is_float8(t.dtype()), op, " (", c.where(), "): ", describe(t),
           " cannot be reduced (float8 tensors take part in no arithmetic: reduce in float32 or "
           "bfloat16)");
  TD_CHECK(!(t.dtype() == DType::Bool && rop == ReduceOp::Avg), op, " (", c.where(),
           "): avg is not defined for bool tensors (sum/max reduce bool with OR, min with AND)");
}

void check_peer(const Communicator& c, int peer, const char* op, const char* what) {
  TD_CHECK(peer >= 0 && peer < c.size(), op, " (", c.where(), "): ", what, " ", peer,
           " is out of range [0, ", c.size(), ")");
}

// Empty splits mean numel / size() each; otherwise size() non-negative entries summing to numel.
std::vector<int64_t> resolve_splits(const Communicator& c, std::vector<int64_t> splits,
                                    const Tensor& t, const char* arg) {
  int n = c.size();
  if (splits.empty()) {
    TD_CHECK(t.numel() % n == 0, "all_to_all (", c.where(), "): without ", arg, " the ",
             arg == std::string("in_splits") ? "input" : "output", " ", describe(t),
             " must have a multiple of ", n, " elements");
    return std::vector<int64_t>(n, t.numel() / n);
  }
  TD_CHECK(static_cast<int>(splits.size()) == n, "all_to_all (", c.where(), "): ", arg, " has ",
           splits.size(), " entries, expected one per rank (", n, ")");
  for (int64_t s : splits) {
    TD_CHECK(s >= 0, "all_to_all (", c.where(), "): ", arg, " has a negative entry ", s);
  }
  int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  TD_CHECK(total == t.numel(), "all_to_all (", c.where(), "): ", arg, " sum to ", total,
           " but the tensor ", describe(t), " has ", t.numel(), " elements");
  return splits;
}

}  // namespace

WorkPtr Communicator::all_reduce(Tensor& t, ReduceOp op, bool async_op) {
  check_tensor(*this, t, "all_reduce", "t");
  check_reduce_op(*this, t, op, "all_reduce");
  return counted(t.nbytes(), [&] { return do_all_reduce(t, op, async_op); });
}

WorkPtr Communicator::all_gather(Tensor& out, const Tensor& in, bool async_op) {
  check_tensor(*this, out, "all_gather", "out");
  check_tensor(*this, in, "all_gather", "in");
  check_same_dtype(*this, out, in, "all_gather");
  check_disjoint(*this, out, in, "all_gather");
  TD_CHECK(out.numel() == size() * in.numel(), "all_gather (", where(), "): out ", describe(out),
           " must have size() * in.numel() = ", size(), " * ", in.numel(), " = ",
           size() * in.numel(), " elements, got ", out.numel(), " (in ", describe(in), ")");
  return counted(in.nbytes(), [&] { return do_all_gather(out, in, async_op); });
}

WorkPtr Communicator::reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async_op) {
  check_tensor(*this, out, "reduce_scatter", "out");
  check_tensor(*this, in, "reduce_scatter", "in");
  check_same_dtype(*this, out, in, "reduce_scatter");
  check_disjoint(*this, out, in, "reduce_scatter");
  check_reduce_op(*this, in, op, "reduce_scatter");
  TD_CHECK(in.numel() == size() * out.numel(), "reduce_scatter (", where(), "): in ", describe(in),
           " must have size() * out.numel() = ", size(), " * ", out.numel(), " = ",
           size() * out.numel(), " elements, got ", in.numel(), " (out ", describe(out), ")");
  return counted(in.nbytes(), [&] { return do_reduce_scatter(out, in, op, async_op); });
}

WorkPtr Communicator::broadcast(Tensor& t, int root, bool async_op) {
  check_tensor(*this, t, "broadcast", "t");
  check_peer(*this, root, "broadcast", "root");
  return counted(t.nbytes(), [&] { return do_broadcast(t, root, async_op); });
}

WorkPtr Communicator::send(const Tensor& t, int dst, int tag, bool async_op) {
  check_tensor(*this, t, "send", "t");
  check_peer(*this, dst, "send", "destination rank");
  TD_CHECK(dst != rank(), "send (", where(), "): cannot send to itself (dst ", dst, ")");
  TD_CHECK(tag >= 0, "send (", where(), "): tag must be >= 0, got ", tag);
  return counted(t.nbytes(), [&] { return do_send(t, dst, tag, async_op); });
}

WorkPtr Communicator::recv(Tensor& t, int src, int tag, bool async_op) {
  check_tensor(*this, t, "recv", "t");
  check_peer(*this, src, "recv", "source rank");
  TD_CHECK(src != rank(), "recv (", where(), "): cannot receive from itself (src ", src, ")");
  TD_CHECK(tag >= 0, "recv (", where(), "): tag must be >= 0, got ", tag);
  return counted(t.nbytes(), [&] { return do_recv(t, src, tag, async_op); });
}

WorkPtr Communicator::all_to_all(Tensor& out, const Tensor& in, std::vector<int64_t> out_splits,
                                 std::vector<int64_t> in_splits, bool async_op) {
  check_tensor(*this, out, "all_to_all", "out");
  check_tensor(*this, in, "all_to_all", "in");
  check_same_dtype(*this, out, in, "all_to_all");
  check_disjoint(*this, out, in, "all_to_all");
  std::vector<int64_t> outs = resolve_splits(*this, std::move(out_splits), out, "out_splits");
  std::vector<int64_t> ins = resolve_splits(*this, std::move(in_splits), in, "in_splits");
  return counted(in.nbytes(), [&] { return do_all_to_all(out, in, outs, ins, async_op); });
}

void Communicator::barrier() {
  counted(0, [&] {
    do_barrier();
    return WorkPtr();
  });
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  TD_CHECK(!name.empty(), "split (", where(), "): the new group needs a name");
  return do_split(color, key, name);
}

}  // namespace td::distributed
