// The NCCL backend of td::distributed::Communicator, for CUDA tensors (CUDA builds only; other
// builds get the "built without CUDA" error). Bootstrapped over an MPI communicator: rank 0
// creates NCCL's unique id, the MPI communicator broadcasts it, the cross-rank consistency
// checks travel over MPI too.
//
// Note [NCCL streams]: "the compute stream" is the calling thread's current stream on the
// communicator's device (cuda::current_stream: the legacy default stream unless the caller set
// another, e.g. a graph capture's). Each collective is enqueued on the
// communicator's own non-blocking stream after an event recorded on the compute stream (so it
// sees every kernel issued before it), and records a completion event. The GPU runs the
// collective concurrently with later compute by itself: no progress thread is needed.
// wait() blocks the host until the completion event has fired (polling cudaEventQuery and
// ncclCommGetAsyncError against the timeout); on a timeout or an asynchronous NCCL error the
// NCCL communicator is aborted (ncclCommAbort, as PyTorch's watchdog does) so that no kernel
// spins forever, and every later call on it is a td::Error.
//
// Note [NCCL point-to-point]: NCCL pairs sends and receives by issue order, without tags; the
// communicator's send/recv go through a TagMatcher (Note [Tag matching] in
// distributed/tag_matching.h) whose channels are two-rank NCCL communicators, one per direction
// and pair of ranks, each on its own stream, opened by the channel's first message with a unique
// id carried in its header.
//
// Note [Host tensors on a NCCL communicator]: an operation whose tensors are all on the CPU runs
// on the MPI communicator the NCCL one was bootstrapped from (the trainer's agreement flags,
// timings and metrics are host values), so one group object serves both kinds; mixing CPU and
// CUDA tensors in one operation is an error.
#include "tardelli/distributed/communicator.h"

#if TD_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/stream.cuh"
#include "tardelli/distributed/tag_matching.h"
#include "tardelli/ops/factory.h"
#endif

namespace td::distributed {

#if TD_WITH_CUDA
namespace {

using Clock = std::chrono::steady_clock;

#define TD_CUDA_CHECK(call, context)                                                 \
  do {                                                                               \
    cudaError_t td_cuda_err_ = (call);                                               \
    if (td_cuda_err_ != cudaSuccess) {                                               \
      TD_ERROR(context, ": ", #call, " failed: ", cudaGetErrorString(td_cuda_err_)); \
    }                                                                                \
  } while (0)

#define TD_NCCL_CHECK(call, context)                                                 \
  do {                                                                               \
    ncclResult_t td_nccl_res_ = (call);                                              \
    if (td_nccl_res_ != ncclSuccess) {                                               \
      TD_ERROR(context, ": ", #call, " failed: ", ncclGetErrorString(td_nccl_res_)); \
    }                                                                                \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32:
      return ncclFloat32;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Float16:
      return ncclFloat16;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    case DType::Bool:
    case DType::Float8E4M3FN:  // moved as bytes; reductions refuse them (check_reduce_op)
    case DType::Float8E5M2:
      return ncclUint8;
  }
  TD_ERROR("nccl: invalid dtype");
}

// bool: Sum/Max are OR, Min is AND (0/1 bytes), as in the MPI backend.
ncclRedOp_t nccl_op(DType t, ReduceOp op) {
  if (t == DType::Bool) return op == ReduceOp::Min ? ncclMin : ncclMax;
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

constexpr const char* kOpNames[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                    "all_to_all", "barrier",    "split"};
constexpr int64_t kNumOps = 7;
int64_t op_code(const char* op) {
  for (int64_t i = 0; i < kNumOps; ++i) {
    if (std::strcmp(op, kOpNames[i]) == 0) return i;
  }
  return kNumOps;
}

// The NCCL communicator and its streams, shared by the Communicator and its Works so that
// a Work outliving its Communicator stays valid.
struct NcclState {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // the communication stream
  cudaEvent_t ready = nullptr;    // recorded on the compute stream before each collective
  void* scratch = nullptr;        // 4 device bytes for barrier()
  std::atomic<bool> aborted{false};
  std::mutex mu;  // guards abort

  void abort() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted.exchange(true)) return;
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
  ~NcclState() {
    cudaSetDevice(device);
    if (comm && !aborted) ncclCommDestroy(comm);
    if (scratch) cudaFree(scratch);
    if (ready) cudaEventDestroy(ready);
    if (stream) cudaStreamDestroy(stream);
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, cudaEvent_t done, std::string what,
           std::vector<Tensor> keep_alive, std::chrono::milliseconds timeout)
      : state_(std::move(state)),
        done_(done),
        what_(std::move(what)),
        keep_alive_(std::move(keep_alive)),
        timeout_(timeout) {}
  ~NcclWork() override {
    cudaSetDevice(state_->device);
    cudaEventDestroy(done_);
  }

  bool is_completed() override {
    if (finished_) return true;
    cudaSetDevice(state_->device);
    cudaError_t e = cudaEventQuery(done_);
    return e != cudaErrorNotReady;  // success, or an error wait() will report
  }

  void wait() override {
    if (finished_) return;
    cudaSetDevice(state_->device);
    Clock::time_point deadline = Clock::now() + timeout_;
    for (;;) {
      cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) break;
      TD_CHECK(e == cudaErrorNotReady, what_, ": cudaEventQuery failed: ", cudaGetErrorString(e));
      TD_CHECK(!state_->aborted.load(), what_, ": the NCCL communicator was aborted");
      ncclResult_t async_err = ncclSuccess;
      if (state_->comm) ncclCommGetAsyncError(state_->comm, &async_err);
      if (async_err != ncclSuccess && async_err != ncclInProgress) {
        state_->abort();
        TD_ERROR(what_, ": NCCL reported an asynchronous error: ", ncclGetErrorString(async_err),
                 " (the NCCL communicator is aborted)");
      }
      if (Clock::now() >= deadline) {
        state_->abort();
        TD_ERROR(what_, " timed out after ", static_cast<double>(timeout_.count()) / 1000.0,
                 " s (a peer died, skipped this operation or issued collectives in a different "
                 "order; the NCCL communicator is aborted)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    finished_ = true;
    keep_alive_.clear();
  }

 private:
  std::shared_ptr<NcclState> state_;
  cudaEvent_t done_;
  std::string what_;
  std::vector<Tensor> keep_alive_;
  std::chrono::milliseconds timeout_;
  bool finished_ = false;
};

// The ordered transport of Note [NCCL point-to-point]: channels are two-rank NCCL communicators
// (sender rank 0, receiver rank 1).
class NcclTransport final : public OrderedTransport {
 public:
  NcclTransport(int device, std::string where, std::chrono::milliseconds timeout)
      : device_(device), where_(std::move(where)), timeout_(timeout) {}

  Fence fence() override {
    TD_CUDA_CHECK(cudaSetDevice(device_), where_);
    cudaEvent_t e = nullptr;
    TD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), where_);
    const cudaError_t rc = cudaEventRecord(e, cuda::current_stream(device_).handle());
    if (rc != cudaSuccess) {
      cudaEventDestroy(e);
      TD_ERROR(where_, ": cudaEventRecord failed: ", cudaGetErrorString(rc));
    }
    const int dev = device_;
    return Fence(e, [dev](void* p) {
      cudaSetDevice(dev);
      cudaEventDestroy(static_cast<cudaEvent_t>(p));
    });
  }

  void bind_thread() override { TD_CUDA_CHECK(cudaSetDevice(device_), where_); }

  std::vector<int64_t> channel_token(int) override {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    TD_NCCL_CHECK(ncclGetUniqueId(&id), where_);
    std::vector<int64_t> words(sizeof(id) / 8);
    std::memcpy(words.data(), &id, sizeof(id));
    return words;
  }

  void open_send(int peer, const std::vector<int64_t>& token) override {
    sends_[peer] = open(token, 0, detail::str_cat(where_, ": channel to rank ", peer));
  }
  void open_recv(int peer, const std::vector<int64_t>& token) override {
    recvs_[peer] = open(token, 1, detail::str_cat(where_, ": channel from rank ", peer));
  }

  WorkPtr send(const Tensor& t, int peer, const Fence& after) override {
    const std::string what = detail::str_cat(where_, ": send of ", t.numel(), " ",
                                             dtype_name(t.dtype()), " to rank ", peer);
    return issue(sends_.at(peer), after, what, t, [&](ncclComm_t c, cudaStream_t s) {
      return ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), 1, c, s);
    });
  }
  WorkPtr recv(Tensor& t, int peer, const Fence& after) override {
    const std::string what = detail::str_cat(where_, ": recv of ", t.numel(), " ",
                                             dtype_name(t.dtype()), " from rank ", peer);
    return issue(recvs_.at(peer), after, what, t, [&](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), 0, c, s);
    });
  }

  Tensor buffer(int64_t numel, DType dtype) override {
    return empty({numel}, {dtype, cuda_device(device_)});
  }

 private:
  std::shared_ptr<NcclState> open(const std::vector<int64_t>& token, int rank,
                                  const std::string& ctx) {
    TD_CHECK(token.size() * 8 == sizeof(ncclUniqueId), ctx, ": bad channel token (", token.size(),
             " words)");
    ncclUniqueId id;
    std::memcpy(&id, token.data(), sizeof(id));
    auto st = std::make_shared<NcclState>();
    st->device = device_;
    TD_CUDA_CHECK(cudaSetDevice(device_), ctx);
    TD_CUDA_CHECK(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), ctx);
    TD_NCCL_CHECK(ncclCommInitRank(&st->comm, 2, id, rank), ctx);
    return st;
  }

  template <typename F>
  WorkPtr issue(const std::shared_ptr<NcclState>& ch, const Fence& after, const std::string& what,
                const Tensor& t, F&& enqueue) {
    TD_CHECK(!ch->aborted.load(), what, ": the channel was aborted by an earlier error");
    if (after) {
      TD_CUDA_CHECK(cudaStreamWaitEvent(ch->stream, static_cast<cudaEvent_t>(after.get()), 0),
                    what);
    }
    const ncclResult_t r = enqueue(ch->comm, ch->stream);
    TD_CHECK(r == ncclSuccess, what, ": NCCL call failed: ", ncclGetErrorString(r), " (",
             ncclGetLastError(ch->comm), ")");
    cudaEvent_t done = nullptr;
    TD_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
    const cudaError_t e = cudaEventRecord(done, ch->stream);
    if (e != cudaSuccess) {
      cudaEventDestroy(done);
      TD_ERROR(what, ": cudaEventRecord failed: ", cudaGetErrorString(e));
    }
    return std::make_shared<NcclWork>(ch, done, what, std::vector<Tensor>{t}, timeout_);
  }

  int device_;
  std::string where_;
  std::chrono::milliseconds timeout_;
  std::map<int, std::shared_ptr<NcclState>> sends_, recvs_;  // by peer; the matching thread's
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(CommPtr mpi, int device, std::string name, CommOptions options)
      : Communicator(mpi->rank(), mpi->size(), std::move(name), options),
        mpi_(std::move(mpi)),
        state_(std::make_shared<NcclState>()) {
    const std::string ctx =
        detail::str_cat("nccl_communicator (", where(), ", device ", device, ")");
    int count = 0;
    TD_CUDA_CHECK(cudaGetDeviceCount(&count), ctx);
    TD_CHECK(device >= 0 && device < count, ctx, ": device ", device, " out of range [0, ", count,
             ")");
    state_->device = device;
    TD_CUDA_CHECK(cudaSetDevice(device), ctx);
    TD_CUDA_CHECK(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), ctx);
    TD_CUDA_CHECK(cudaEventCreateWithFlags(&state_->ready, cudaEventDisableTiming), ctx);
    TD_CUDA_CHECK(cudaMalloc(&state_->scratch, 4), ctx);
    // Rank 0's unique id travels over MPI (the broadcast has the MPI communicator's timeout).
    static_assert(sizeof(ncclUniqueId) % 8 == 0);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (rank() == 0) TD_NCCL_CHECK(ncclGetUniqueId(&id), ctx);
    Tensor id_words = zeros({static_cast<int64_t>(sizeof(id) / 8)}, {DType::Int64});
    std::memcpy(id_words.data_ptr(), &id, sizeof(id));
    mpi_->broadcast(id_words, 0);
    std::memcpy(&id, id_words.data_ptr(), sizeof(id));
    TD_NCCL_CHECK(ncclCommInitRank(&state_->comm, size(), id, rank()), ctx);
    p2p_ = std::make_unique<TagMatcher>(
        mpi_, std::make_unique<NcclTransport>(device, where(), options.timeout), where(),
        options.timeout);
  }

  const char* backend() const override { return "nccl"; }

 protected:
  WorkPtr do_all_reduce(Tensor& t, ReduceOp op, bool async_op) override {
    if (on_host("all_reduce", {&t})) return mpi_->all_reduce(t, op, async_op);
    if (options().check_consistency) {
      check_consistency("all_reduce", t.dtype(), t.numel(), static_cast<int64_t>(op));
    }
    return launch(
        detail::str_cat("all_reduce(", reduce_op_name(op), ") of ", t.numel(), " ",
                        dtype_name(t.dtype())),
        {t},
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                               nccl_type(t.dtype()), nccl_op(t.dtype(), op), c, s);
        },
        async_op);
  }

  WorkPtr do_all_gather(Tensor& out, const Tensor& in, bool async_op) override {
    if (on_host("all_gather", {&out, &in})) return mpi_->all_gather(out, in, async_op);
    if (options().check_consistency) check_consistency("all_gather", in.dtype(), in.numel(), 0);
    return launch(
        detail::str_cat("all_gather of ", in.numel(), " ", dtype_name(in.dtype()), " per rank"),
        {out, in},
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                               nccl_type(in.dtype()), c, s);
        },
        async_op);
  }

  WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async_op) override {
    if (on_host("reduce_scatter", {&out, &in})) {
      return mpi_->reduce_scatter(out, in, op, async_op);
    }
    if (options().check_consistency) {
      check_consistency("reduce_scatter", out.dtype(), out.numel(), static_cast<int64_t>(op));
    }
    return launch(
        detail::str_cat("reduce_scatter(", reduce_op_name(op), ") of ", out.numel(), " ",
                        dtype_name(out.dtype()), " per rank"),
        {out, in},
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                                   nccl_type(in.dtype()), nccl_op(in.dtype(), op), c, s);
        },
        async_op);
  }

  WorkPtr do_broadcast(Tensor& t, int root, bool async_op) override {
    if (on_host("broadcast", {&t})) return mpi_->broadcast(t, root, async_op);
    if (options().check_consistency) check_consistency("broadcast", t.dtype(), t.numel(), root);
    return launch(
        detail::str_cat("broadcast (root ", root, ") of ", t.numel(), " ", dtype_name(t.dtype())),
        {t},
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                               nccl_type(t.dtype()), root, c, s);
        },
        async_op);
  }

  // Note [NCCL point-to-point]: tags are matched by the TagMatcher.
  WorkPtr do_send(const Tensor& t, int dst, int tag, bool async_op) override {
    if (on_host("send", {&t})) return mpi_->send(t, dst, tag, async_op);
    WorkPtr w = p2p_->send(t, dst, tag);
    if (async_op) return w;
    w->wait();
    return nullptr;
  }

  WorkPtr do_recv(Tensor& t, int src, int tag, bool async_op) override {
    if (on_host("recv", {&t})) return mpi_->recv(t, src, tag, async_op);
    WorkPtr w = p2p_->recv(t, src, tag);
    if (async_op) return w;
    w->wait();
    return nullptr;
  }

  // NCCL has no all-to-all: one group of sends and receives, as PyTorch does.
  WorkPtr do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                        const std::vector<int64_t>& in_splits, bool async_op) override {
    if (on_host("all_to_all", {&out, &in})) {
      return mpi_->all_to_all(out, in, out_splits, in_splits, async_op);
    }
    if (options().check_consistency) check_splits(in, in_splits, out_splits);
    const size_t es = in.element_size();
    return launch(
        detail::str_cat("all_to_all of ", in.numel(), " ", dtype_name(in.dtype()), " (receiving ",
                        out.numel(), ")"),
        {out, in},
        [&](ncclComm_t c, cudaStream_t s) {
          ncclResult_t r = ncclGroupStart();
          if (r != ncclSuccess) return r;
          ncclDataType_t dt = nccl_type(in.dtype());
          char* send_base = static_cast<char*>(in.data_ptr());
          char* recv_base = static_cast<char*>(out.data_ptr());
          int64_t so = 0, ro = 0;
          for (int j = 0; j < size() && r == ncclSuccess; ++j) {
            if (in_splits[j] > 0) {
              r = ncclSend(send_base + so * es, static_cast<size_t>(in_splits[j]), dt, j, c, s);
            }
            if (r == ncclSuccess && out_splits[j] > 0) {
              r = ncclRecv(recv_base + ro * es, static_cast<size_t>(out_splits[j]), dt, j, c, s);
            }
            so += in_splits[j];
            ro += out_splits[j];
          }
          ncclResult_t end = ncclGroupEnd();
          return r != ncclSuccess ? r : end;
        },
        async_op);
  }

  void do_barrier() override {
    if (options().check_consistency) check_consistency("barrier", DType::Float32, 0, 0);
    launch(
        "barrier", {},
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclAllReduce(state_->scratch, state_->scratch, 1, ncclInt32, ncclSum, c, s);
        },
        false);
  }

  std::shared_ptr<Communicator> do_split(int color, int key, const std::string& name) override {
    CommPtr sub = mpi_->split(color, key, name);
    if (!sub) return nullptr;
    return std::make_shared<NcclCommunicator>(sub, state_->device, name, options());
  }

  // Over MPI, with every rank's values in the message on every rank (as the MPI backend).
  void check_consistency(const char* op, DType dtype, int64_t count, int64_t aux) override {
    std::vector<int64_t> mine = {op_code(op), static_cast<int64_t>(dtype), count, aux};
    std::vector<int64_t> all = gather(mine);
    bool same = true;
    for (size_t i = 4; i < all.size(); ++i) same = same && all[i] == all[i % 4];
    if (same) return;
    std::string ranks;
    for (int r = 0; r < size(); ++r) {
      int64_t code = all[4 * r];
      ranks += detail::str_cat("\n  rank ", r, ": ",
                               code >= 0 && code < kNumOps ? kOpNames[code] : "?", " of ",
                               all[4 * r + 2], " ", dtype_name(static_cast<DType>(all[4 * r + 1])),
                               " (reduce op or root ", all[4 * r + 3], ")");
    }
    TD_ERROR(op, " (", where(),
             "): the ranks disagree on the collective (each rank must issue the "
             "same collectives in the same order with the same dtype and count):",
             ranks);
  }

 private:
  std::vector<int64_t> gather(const std::vector<int64_t>& mine) {
    const int64_t k = static_cast<int64_t>(mine.size());
    Tensor in = from_vector(mine, {k});
    Tensor out = empty({k * size()}, {DType::Int64});
    mpi_->all_gather(out, in);
    return to_vector<int64_t>(out);
  }

  void check_splits(const Tensor& in, const std::vector<int64_t>& in_splits,
                    const std::vector<int64_t>& out_splits) {
    const int n = size();
    std::vector<int64_t> mine = {static_cast<int64_t>(in.dtype())};
    mine.insert(mine.end(), in_splits.begin(), in_splits.end());
    mine.insert(mine.end(), out_splits.begin(), out_splits.end());
    const size_t k = mine.size();
    std::vector<int64_t> all = gather(mine);
    std::string problems;
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < n; ++j) {
        int64_t sends = all[k * r + 1 + j], expects = all[k * j + 1 + n + r];
        if (sends != expects) {
          problems += detail::str_cat("\n  rank ", r, " sends ", sends, " elements to rank ", j,
                                      ", which expects ", expects);
        }
      }
      if (all[k * r] != mine[0]) {
        problems += detail::str_cat("\n  rank ", r, " has dtype ",
                                    dtype_name(static_cast<DType>(all[k * r])));
      }
    }
    TD_CHECK(problems.empty(), "all_to_all (", where(), "): the ranks' splits disagree:", problems);
  }

  // Note [NCCL streams].
  template <typename F>
  WorkPtr launch(const std::string& what_op, std::vector<Tensor> keep_alive, F&& enqueue,
                 bool async_op) {
    const std::string what = where() + ": " + what_op;
    TD_CHECK(!state_->aborted.load(), what,
             ": the NCCL communicator was aborted by an earlier "
             "timeout or error; create a new one");
    TD_CUDA_CHECK(cudaSetDevice(state_->device), what);
    TD_CUDA_CHECK(cudaEventRecord(state_->ready, cuda::current_stream(state_->device).handle()),
                  what);
    TD_CUDA_CHECK(cudaStreamWaitEvent(state_->stream, state_->ready, 0), what);
    ncclResult_t r = enqueue(state_->comm, state_->stream);
    TD_CHECK(r == ncclSuccess, what, ": NCCL call failed: ", ncclGetErrorString(r), " (",
             ncclGetLastError(state_->comm), ")");
    cudaEvent_t done = nullptr;
    TD_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
    cudaError_t e = cudaEventRecord(done, state_->stream);
    if (e != cudaSuccess) {
      cudaEventDestroy(done);
      TD_ERROR(what, ": cudaEventRecord failed: ", cudaGetErrorString(e));
    }
    auto work =
        std::make_shared<NcclWork>(state_, done, what, std::move(keep_alive), options().timeout);
    if (async_op) return work;
    work->wait();
    return nullptr;
  }

  // Note [Host tensors on a NCCL communicator]: true when every tensor is on the CPU (the
  // operation then runs over MPI); false when every one is on this communicator's device.
  bool on_host(const char* op, std::initializer_list<const Tensor*> ts) const {
    int host = 0, here = 0;
    for (const Tensor* t : ts) {
      if (!t->is_cuda()) {
        ++host;
      } else if (t->device().index == state_->device) {
        ++here;
      }
    }
    const int n = static_cast<int>(ts.size());
    TD_CHECK(host == n || here == n, op, " (", where(),
             "): tensors must all be on the CPU or all on ", "cuda:", state_->device,
             " (the communicator's device)");
    return host == n;
  }

  CommPtr mpi_;
  std::shared_ptr<NcclState> state_;
  std::unique_ptr<TagMatcher> p2p_;
};

}  // namespace

CommPtr nccl_communicator(const CommPtr& mpi_comm, int device, CommOptions options) {
  TD_CHECK(mpi_comm != nullptr, "nccl_communicator: the bootstrap communicator is null");
  TD_CHECK(std::string(mpi_comm->backend()) == "mpi",
           "nccl_communicator: bootstraps over an MPI "
           "communicator, got a '",
           mpi_comm->backend(), "' one (", mpi_comm->where(), ")");
  return std::make_shared<NcclCommunicator>(mpi_comm, device, mpi_comm->name(), options);
}

#else  // !TD_WITH_CUDA

CommPtr nccl_communicator(const CommPtr& mpi_comm, int device, CommOptions) {
  TD_ERROR(
      "nccl_communicator: this build of tardelli has no CUDA backend (configure with "
      "-DTD_WITH_CUDA=ON); device ",
      device, " requested");
}

#endif  // TD_WITH_CUDA

}  // namespace td::distributed
