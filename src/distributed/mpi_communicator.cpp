// The MPI backend: non-blocking MPI driven by a progress thread (Note [Progress thread] in
// mpi_communicator.h), timeouts on every wait, cross-rank consistency checks. Without MPI
// (TD_WITH_MPI=OFF) this file only provides the "built without MPI" errors.
#include "distributed/mpi_communicator.h"

#include <sched.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace td::distributed {

#if TD_WITH_MPI
namespace mpi {
namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, len);
}

#define TD_MPI_CHECK(call, context)                                              \
  do {                                                                           \
    int td_mpi_rc_ = (call);                                                     \
    if (td_mpi_rc_ != MPI_SUCCESS) {                                             \
      TD_ERROR(context, ": ", #call, " failed: ", mpi_error_string(td_mpi_rc_)); \
    }                                                                            \
  } while (0)

std::string seconds_str(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000.0;
  return os.str();
}

std::string timeout_message(const std::string& what, std::chrono::milliseconds timeout) {
  return detail::str_cat(
      what, " timed out after ", seconds_str(timeout),
      " s (a peer died, skipped this operation or issued collectives in a different order; "
      "the operation stays pending: call td::distributed::abort_world unless the peers can "
      "still join it)");
}

// Note [Polling]: by time since the last progress: spin for the first 50 us (lowest latency
// when every rank has its own core), then sched_yield until 20 ms (still polling flat out on an
// idle core, but an oversubscribed core goes to the peer rank that has work), then sleep in
// 20 us slices. Sleeping early would stall large transfers, which OpenMPI moves fragment by
// fragment only while someone polls (measured: a 32 MiB all_reduce ran 3x slower).
class Backoff {
 public:
  void reset() { start_ = Clock::now(); }
  bool sleeping() const { return Clock::now() - start_ >= kYieldFor; }
  void pause() {
    auto idle = Clock::now() - start_;
    if (idle < kSpinFor) return;
    if (idle < kYieldFor) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(kSleep);
  }
  static constexpr std::chrono::microseconds kSpinFor{50};
  static constexpr std::chrono::milliseconds kYieldFor{20};
  static constexpr std::chrono::microseconds kSleep{20};

 private:
  Clock::time_point start_ = Clock::now();
};

// Note [Reduced-precision reductions]: MPI has no bf16 (and no portable f16) type. bf16/f16
// reductions use user-defined MPI_Ops on 16-bit words: each pairwise combine widens both
// operands to fp32, combines them and rounds to the 16-bit type once (round to nearest even).
// A sum over n ranks thus incurs n - 1 roundings, |error| <= (n - 1) * u * sum|x_i| with
// u = 2^-8 (bf16) or 2^-11 (f16): the numerics of NCCL's bf16 all-reduce, at no extra
// bandwidth (gathering everything to reduce in fp32 would cost size() times the traffic).
// The ops are commutative, which lets MPI pick its fast algorithms; every rank still ends with
// the same bits (tested).
template <typename H, int Kind>  // Kind: 0 sum, 1 max, 2 min
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = H::to_float(a[i]), y = H::to_float(b[i]);
    float r;
    if constexpr (Kind == 0) {
      r = x + y;
    } else if constexpr (Kind == 1) {
      r = (x > y || x != x) ? x : y;  // NaN propagates
    } else {
      r = (x < y || x != x) ? x : y;
    }
    b[i] = H::from_float(r);
  }
}

// The process-wide MPI state: who initialized MPI, the progress engine, the 16-bit ops.
struct Runtime {
  std::mutex mu;
  bool initialized_by_us = false;
  bool at_exit_registered = false;
  std::unique_ptr<ProgressEngine> engine;
  MPI_Op ops16[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                        {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

bool mpi_live() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void finalize_at_exit() {
  td::distributed::finalize();
}

void ensure_initialized() {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mu);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  TD_CHECK(!fin, "mpi_world: MPI was already finalized in this process (it cannot restart)");
  if (!init) {
    // Note [Non-blocking all_reduce algorithm]: every td collective is non-blocking (timeouts,
    // async progress), and Open MPI's libnbc picks binomial/recursive-doubling for
    // MPI_Iallreduce by default, 2.3-4x slower than the tuned blocking MPI_Allreduce from
    // 128 KiB up on this machine (benchmarks/comm_bench). Its ring algorithm matches the
    // blocking call (1.02-1.19x). Set it unless the user chose one (overwrite = 0); other MPI
    // implementations ignore the variable.
    ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    int provided = 0;
    TD_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "mpi_world");
    rt.initialized_by_us = true;
  }
  int level = 0;
  MPI_Query_thread(&level);
  TD_CHECK(level == MPI_THREAD_MULTIPLE, "mpi_world: MPI runs at thread level ", level,
           " but the communicator's progress thread needs MPI_THREAD_MULTIPLE (",
           MPI_THREAD_MULTIPLE,
           "); initialize MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) or let td do it");
  if (rt.ops16[0][0] == MPI_OP_NULL) {
    MPI_User_function* fns[2][3] = {
        {reduce_16bit<BFloat16, 0>, reduce_16bit<BFloat16, 1>, reduce_16bit<BFloat16, 2>},
        {reduce_16bit<Float16, 0>, reduce_16bit<Float16, 1>, reduce_16bit<Float16, 2>}};
    for (int d = 0; d < 2; ++d) {
      for (int k = 0; k < 3; ++k) {
        TD_MPI_CHECK(MPI_Op_create(fns[d][k], 1, &rt.ops16[d][k]), "mpi_world");
      }
    }
  }
  if (!rt.at_exit_registered) {
    std::atexit(finalize_at_exit);
    rt.at_exit_registered = true;
  }
}

struct FinalizeHooks {
  std::mutex mu;
  int next = 0;
  std::map<int, std::function<void()>> hooks;
};

FinalizeHooks& finalize_hooks() {
  static auto* h = new FinalizeHooks();  // never destroyed: used from atexit
  return *h;
}

ProgressEngine& engine() {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mu);
  if (!rt.engine) rt.engine = std::make_unique<ProgressEngine>();
  return *rt.engine;
}

MPI_Datatype mpi_type(DType t) {
  static_assert(sizeof(bool) == 1, "bool tensors travel as MPI_UINT8_T");
  switch (t) {
    case DType::Float32:
      return MPI_FLOAT;
    case DType::BFloat16:
    case DType::Float16:
      return MPI_UINT16_T;
    case DType::Int32:
      return MPI_INT32_T;
    case DType::Int64:
      return MPI_INT64_T;
    case DType::Bool:
    case DType::Float8E4M3FN:  // moved as bytes; reductions refuse them (check_reduce_op)
    case DType::Float8E5M2:
      return MPI_UINT8_T;
  }
  TD_ERROR("mpi: invalid dtype");
}

// bool: Sum/Max are OR, Min is AND (values are 0/1 bytes); bf16/f16: Note [Reduced-precision
// reductions]; Avg sums, then divides when the operation completes.
MPI_Op mpi_op(DType t, ReduceOp op) {
  int kind = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;
  if (t == DType::BFloat16) return runtime().ops16[0][kind];
  if (t == DType::Float16) return runtime().ops16[1][kind];
  if (t == DType::Bool) return kind == 2 ? MPI_MIN : MPI_MAX;
  return kind == 0 ? MPI_SUM : kind == 1 ? MPI_MAX : MPI_MIN;
}

void divide_by(const Tensor& t, int n) {
  TD_DISPATCH_NUMERIC(t.dtype(), "all_reduce(avg)", [&]<typename T>() {
    T* p = t.data_ptr<T>();
    int64_t count = t.numel();
    for (int64_t i = 0; i < count; ++i) p[i] = T(static_cast<acc_t<T>>(p[i]) / n);
  });
}

int to_int(int64_t n, const std::string& what) {
  TD_CHECK(n <= INT_MAX, what, ": ", n, " elements exceed MPI's int count (", INT_MAX,
           "); split the tensor");
  return static_cast<int>(n);
}

// The op codes of the consistency check.
constexpr const char* kOpNames[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                    "all_to_all", "barrier",    "split"};
int64_t op_code(const char* op) {
  for (int i = 0; i < 7; ++i) {
    if (std::string(op) == kOpNames[i]) return i;
  }
  return 99;
}

std::string describe_call(int64_t code, int64_t dtype, int64_t count, int64_t aux) {
  std::string name = code >= 0 && code < 7 ? kOpNames[code] : "?";
  std::string s = name;
  if (name == "all_reduce" || name == "reduce_scatter") {
    s += detail::str_cat("(", reduce_op_name(static_cast<ReduceOp>(aux)), ")");
  } else if (name == "broadcast") {
    s += detail::str_cat("(root ", aux, ")");
  } else if (name == "all_to_all") {
    s += detail::str_cat(" of ", dtype_name(static_cast<DType>(dtype)));
  }
  if (name != "barrier" && name != "split" && name != "all_to_all") {
    s += detail::str_cat(" of ", count, " ", dtype_name(static_cast<DType>(dtype)));
  }
  return s;
}

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<Op> op, std::chrono::milliseconds timeout)
      : op_(std::move(op)), timeout_(timeout) {}
  void wait() override { op_->wait_until(Clock::now() + timeout_, timeout_); }
  bool is_completed() override { return op_->done.load(std::memory_order_acquire); }

 private:
  std::shared_ptr<Op> op_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

int add_finalize_hook(std::function<void()> hook) {
  FinalizeHooks& h = finalize_hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  h.hooks.emplace(h.next, std::move(hook));
  return h.next++;
}

void remove_finalize_hook(int id) {
  FinalizeHooks& h = finalize_hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  h.hooks.erase(id);
}

// ---- Op ----

bool Op::test() {
  int flag = 0;
  int rc = MPI_SUCCESS;
  if (requests.empty()) {
    flag = 1;
  } else {
    statuses.resize(requests.size());
    rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, statuses.data());
  }
  if (rc != MPI_SUCCESS) {
    std::string detail = mpi_error_string(rc);
    if (rc == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& st : statuses) {
        if (st.MPI_ERROR != MPI_SUCCESS) detail += "; " + mpi_error_string(st.MPI_ERROR);
      }
    }
    complete(std::make_exception_ptr(Error(what + " failed: MPI_Testall: " + detail)));
    return true;
  }
  if (!flag) return false;
  std::exception_ptr e;
  try {
    if (finish) finish(*this);
  } catch (...) {
    e = std::current_exception();
  }
  complete(e);
  return true;
}

void Op::complete(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu);
    error = std::move(e);
    keep_alive.clear();
    done.store(true, std::memory_order_release);
  }
  cv.notify_all();
}

void Op::wait_until(Clock::time_point deadline, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_until(lock, deadline, [&] { return done.load(std::memory_order_acquire); })) {
    throw Error(timeout_message(what, timeout));
  }
  if (error) std::rethrow_exception(error);
}

// ---- ProgressEngine ----

ProgressEngine::ProgressEngine() : thread_([this] { loop(); }) {}

ProgressEngine::~ProgressEngine() {
  stop();
}

void ProgressEngine::submit(std::shared_ptr<Op> op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(op));
  }
  cv_.notify_one();
}

void ProgressEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void ProgressEngine::loop() {
  std::vector<std::shared_ptr<Op>> active;
  Backoff backoff;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return stop_ || !incoming_.empty(); };
      if (active.empty()) {
        cv_.wait(lock, ready);
      } else if (backoff.sleeping()) {
        // Sleep in short slices, but wake at once for new work (Note [Polling]).
        cv_.wait_for(lock, Backoff::kSleep, ready);
      }
      if (stop_) return;
      if (!incoming_.empty()) {
        for (auto& op : incoming_) active.push_back(std::move(op));
        incoming_.clear();
        backoff.reset();
      }
    }
    bool progressed = false;
    for (size_t i = 0; i < active.size();) {
      if (active[i]->test()) {
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
        progressed = true;
      } else {
        ++i;
      }
    }
    if (progressed) {
      backoff.reset();
    } else if (!backoff.sleeping()) {
      backoff.pause();
    }
  }
}

// ---- MpiCommunicator ----

namespace {
int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
int comm_size(MPI_Comm c) {
  int s = 0;
  MPI_Comm_size(c, &s);
  return s;
}
}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, CommOptions options)
    : Communicator(comm_rank(comm), comm_size(comm), std::move(name), options), comm_(comm) {
  // Errors come back as codes, which become td::Errors naming the call.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ != MPI_COMM_WORLD && mpi_live()) MPI_Comm_free(&comm_);
}

std::shared_ptr<Op> MpiCommunicator::make_op(const std::string& what,
                                             std::vector<Tensor> keep_alive) const {
  auto op = std::make_shared<Op>();
  op->what = where() + ": " + what;
  op->keep_alive = std::move(keep_alive);
  return op;
}

WorkPtr MpiCommunicator::run(std::shared_ptr<Op> op, bool async_op) {
  std::chrono::milliseconds timeout = options().timeout;
  if (async_op) {
    engine().submit(op);
    return std::make_shared<MpiWork>(std::move(op), timeout);
  }
  Clock::time_point deadline = Clock::now() + timeout;
  Backoff backoff;
  while (!op->test()) {
    if (Clock::now() >= deadline) {
      // The request cannot be cancelled: the engine keeps it (and its buffers) going.
      engine().submit(op);
      throw Error(timeout_message(op->what, timeout));
    }
    backoff.pause();
  }
  if (op->error) std::rethrow_exception(op->error);
  return nullptr;
}

std::vector<int64_t> MpiCommunicator::allgather_small(const std::vector<int64_t>& mine,
                                                      const std::string& what) {
  auto result = std::make_shared<std::vector<int64_t>>(mine.size() * size());
  auto send = std::make_shared<std::vector<int64_t>>(mine);
  auto op = make_op(what, {});
  op->requests.resize(1);
  int k = static_cast<int>(mine.size());
  TD_MPI_CHECK(MPI_Iallgather(send->data(), k, MPI_INT64_T, result->data(), k, MPI_INT64_T, comm_,
                              op->requests.data()),
               op->what);
  // The buffers must outlive a timed-out request that the engine keeps polling.
  op->finish = [send, result](Op&) {};
  run(op, false);
  return *result;
}

void MpiCommunicator::check_consistency(const char* op, DType dtype, int64_t count, int64_t aux) {
  const int64_t code = op_code(op);
  std::vector<int64_t> mine = {code, static_cast<int64_t>(dtype), count, aux};
  std::vector<int64_t> all = allgather_small(
      mine, detail::str_cat("consistency check before ", describe_call(code, mine[1], count, aux)));
  bool same = true;
  for (int r = 1; r < size(); ++r) {
    for (int j = 0; j < 4; ++j) same = same && all[4 * r + j] == all[j];
  }
  if (same) return;
  std::string ranks;
  for (int r = 0; r < size(); ++r) {
    ranks +=
        detail::str_cat("\n  rank ", r, ": ",
                        describe_call(all[4 * r], all[4 * r + 1], all[4 * r + 2], all[4 * r + 3]));
  }
  TD_ERROR(op, " (", where(), "): the ranks disagree on the collective (each rank must issue the ",
           "same collectives in the same order with the same dtype and count):", ranks);
}

WorkPtr MpiCommunicator::do_all_reduce(Tensor& t, ReduceOp rop, bool async_op) {
  if (options().check_consistency) {
    check_consistency("all_reduce", t.dtype(), t.numel(), static_cast<int64_t>(rop));
  }
  auto op = make_op(detail::str_cat("all_reduce(", reduce_op_name(rop), ") of ", t.numel(), " ",
                                    dtype_name(t.dtype())),
                    {t});
  op->requests.resize(1);
  TD_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), to_int(t.numel(), op->what), mpi_type(t.dtype()),
                     mpi_op(t.dtype(), rop), comm_, op->requests.data()),
      op->what);
  if (rop == ReduceOp::Avg) {
    int n = size();
    op->finish = [t, n](Op&) { divide_by(t, n); };
  }
  return run(std::move(op), async_op);
}

WorkPtr MpiCommunicator::do_all_gather(Tensor& out, const Tensor& in, bool async_op) {
  if (options().check_consistency) check_consistency("all_gather", in.dtype(), in.numel(), 0);
  auto op = make_op(
      detail::str_cat("all_gather of ", in.numel(), " ", dtype_name(in.dtype()), " per rank"),
      {out, in});
  op->requests.resize(1);
  int n = to_int(in.numel(), op->what);
  to_int(out.numel(), op->what);
  MPI_Datatype dt = mpi_type(in.dtype());
  TD_MPI_CHECK(
      MPI_Iallgather(in.data_ptr(), n, dt, out.data_ptr(), n, dt, comm_, op->requests.data()),
      op->what);
  return run(std::move(op), async_op);
}

WorkPtr MpiCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp rop,
                                           bool async_op) {
  if (options().check_consistency) {
    check_consistency("reduce_scatter", out.dtype(), out.numel(), static_cast<int64_t>(rop));
  }
  auto op = make_op(detail::str_cat("reduce_scatter(", reduce_op_name(rop), ") of ", out.numel(),
                                    " ", dtype_name(out.dtype()), " per rank"),
                    {out, in});
  op->requests.resize(1);
  to_int(in.numel(), op->what);
  TD_MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(),
                                         to_int(out.numel(), op->what), mpi_type(in.dtype()),
                                         mpi_op(in.dtype(), rop), comm_, op->requests.data()),
               op->what);
  if (rop == ReduceOp::Avg) {
    int n = size();
    op->finish = [out, n](Op&) { divide_by(out, n); };
  }
  return run(std::move(op), async_op);
}

WorkPtr MpiCommunicator::do_broadcast(Tensor& t, int root, bool async_op) {
  if (options().check_consistency) check_consistency("broadcast", t.dtype(), t.numel(), root);
  auto op = make_op(
      detail::str_cat("broadcast (root ", root, ") of ", t.numel(), " ", dtype_name(t.dtype())),
      {t});
  op->requests.resize(1);
  TD_MPI_CHECK(MPI_Ibcast(t.data_ptr(), to_int(t.numel(), op->what), mpi_type(t.dtype()), root,
                          comm_, op->requests.data()),
               op->what);
  return run(std::move(op), async_op);
}

WorkPtr MpiCommunicator::do_send(const Tensor& t, int dst, int tag, bool async_op) {
  auto op = make_op(detail::str_cat("send of ", t.numel(), " ", dtype_name(t.dtype()), " to rank ",
                                    dst, " (tag ", tag, ")"),
                    {t});
  op->requests.resize(1);
  TD_MPI_CHECK(MPI_Isend(t.data_ptr(), to_int(t.numel(), op->what), mpi_type(t.dtype()), dst, tag,
                         comm_, op->requests.data()),
               op->what);
  return run(std::move(op), async_op);
}

bool MpiCommunicator::probe(int tag, int* src) const {
  int flag = 0;
  MPI_Status status;
  TD_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &flag, &status), where() + ": probe");
  if (flag != 0) *src = status.MPI_SOURCE;
  return flag != 0;
}

WorkPtr MpiCommunicator::do_recv(Tensor& t, int src, int tag, bool async_op) {
  auto op = make_op(detail::str_cat("recv of ", t.numel(), " ", dtype_name(t.dtype()),
                                    " from rank ", src, " (tag ", tag, ")"),
                    {t});
  op->requests.resize(1);
  MPI_Datatype dt = mpi_type(t.dtype());
  TD_MPI_CHECK(MPI_Irecv(t.data_ptr(), to_int(t.numel(), op->what), dt, src, tag, comm_,
                         op->requests.data()),
               op->what);
  // A shorter message fits silently in MPI: make it an error (a longer one fails with
  // MPI_ERR_TRUNCATE).
  int64_t expected = t.numel();
  op->finish = [expected, dt](Op& o) {
    int got = 0;
    MPI_Get_count(&o.statuses[0], dt, &got);
    TD_CHECK(got == expected, o.what, ": the sender sent ", got, " elements, expected ", expected,
             " (sender and receiver must agree on dtype and count)");
  };
  return run(std::move(op), async_op);
}

WorkPtr MpiCommunicator::do_all_to_all(Tensor& out, const Tensor& in,
                                       const std::vector<int64_t>& out_splits,
                                       const std::vector<int64_t>& in_splits, bool async_op) {
  const int n = size();
  if (options().check_consistency) {
    // First the same fixed-size check as every collective (so a rank inside another collective
    // is reported as such), then the whole split matrix, which every rank sees, so a mismatch
    // fails on every rank alike.
    check_consistency("all_to_all", in.dtype(), 0, 0);
    std::vector<int64_t> mine(in_splits.begin(), in_splits.end());
    mine.insert(mine.end(), out_splits.begin(), out_splits.end());
    const size_t k = mine.size();
    std::vector<int64_t> all =
        allgather_small(mine, detail::str_cat("split check before all_to_all of ", in.numel(), " ",
                                              dtype_name(in.dtype())));
    std::string problems;
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < n; ++j) {
        int64_t sends = all[k * r + j];        // r -> j
        int64_t expects = all[k * j + n + r];  // j's out_splits[r]
        if (sends != expects) {
          problems += detail::str_cat("\n  rank ", r, " sends ", sends, " elements to rank ", j,
                                      ", which expects ", expects);
        }
      }
    }
    TD_CHECK(problems.empty(), "all_to_all (", where(),
             "): the ranks' splits disagree (in_splits[j] of rank r must equal out_splits[r] of "
             "rank j):",
             problems);
  }
  auto op = make_op(detail::str_cat("all_to_all of ", in.numel(), " ", dtype_name(in.dtype()),
                                    " (receiving ", out.numel(), ")"),
                    {out, in});
  op->requests.resize(1);
  MPI_Datatype dt = mpi_type(in.dtype());
  to_int(in.numel(), op->what);
  to_int(out.numel(), op->what);
  bool equal = true;
  for (int j = 0; j < n; ++j)
    equal = equal && in_splits[j] == in_splits[0] && out_splits[j] == in_splits[0];
  if (equal) {
    int c = static_cast<int>(in_splits[0]);
    TD_MPI_CHECK(
        MPI_Ialltoall(in.data_ptr(), c, dt, out.data_ptr(), c, dt, comm_, op->requests.data()),
        op->what);
    return run(std::move(op), async_op);
  }
  // Counts and displacements must live until completion: the finish lambda owns them.
  auto v = std::make_shared<std::vector<int>>(4 * n);
  int* sc = v->data();
  int* sd = sc + n;
  int* rc = sd + n;
  int* rd = rc + n;
  int64_t so = 0, ro = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = static_cast<int>(in_splits[j]);
    sd[j] = static_cast<int>(so);
    rc[j] = static_cast<int>(out_splits[j]);
    rd[j] = static_cast<int>(ro);
    so += in_splits[j];
    ro += out_splits[j];
  }
  TD_MPI_CHECK(MPI_Ialltoallv(in.data_ptr(), sc, sd, dt, out.data_ptr(), rc, rd, dt, comm_,
                              op->requests.data()),
               op->what);
  op->finish = [v](Op&) {};
  return run(std::move(op), async_op);
}

void MpiCommunicator::do_barrier() {
  if (options().check_consistency) {
    // The consistency all-gather synchronizes every rank: it is the barrier.
    check_consistency("barrier", DType::Float32, 0, 0);
    return;
  }
  auto op = make_op("barrier", {});
  op->requests.resize(1);
  TD_MPI_CHECK(MPI_Ibarrier(comm_, op->requests.data()), op->what);
  run(std::move(op), false);
}

std::shared_ptr<Communicator> MpiCommunicator::do_split(int color, int key,
                                                        const std::string& name) {
  // MPI_Comm_split blocks with no timeout: first make sure every rank has arrived.
  check_consistency("split", DType::Float32, 0, 0);
  MPI_Comm sub = MPI_COMM_NULL;
  TD_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub),
               detail::str_cat("split (", where(), ") into '", name, "'"));
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_shared<MpiCommunicator>(sub, name, options());
}

}  // namespace mpi

CommPtr mpi_world(CommOptions options) {
  mpi::ensure_initialized();
  return std::make_shared<mpi::MpiCommunicator>(MPI_COMM_WORLD, "world", options);
}

bool mpi_available() {
  return true;
}

void finalize() {
  {
    std::map<int, std::function<void()>> hooks;
    {
      mpi::FinalizeHooks& h = mpi::finalize_hooks();
      std::lock_guard<std::mutex> lock(h.mu);
      hooks.swap(h.hooks);
    }
    for (auto& [id, hook] : hooks) hook();
  }
  mpi::Runtime& rt = mpi::runtime();
  std::lock_guard<std::mutex> lock(rt.mu);
  if (rt.engine) {
    rt.engine->stop();
    rt.engine.reset();
  }
  if (!mpi::mpi_live()) return;
  for (auto& row : rt.ops16) {
    for (MPI_Op& op : row) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  }
  if (rt.initialized_by_us) MPI_Finalize();
}

void abort_world(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi::mpi_live()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

#else  // !TD_WITH_MPI

CommPtr mpi_world(CommOptions) {
  TD_ERROR(
      "mpi_world: this build of tardelli has no MPI backend (configure with -DTD_WITH_MPI=ON)");
}

bool mpi_available() {
  return false;
}

void finalize() {}

void abort_world(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

#endif  // TD_WITH_MPI

}  // namespace td::distributed
