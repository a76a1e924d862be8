#pragma once
// td::distributed::Communicator: the collectives every parallel strategy uses, on one group of
// processes. A communicator is a value that layers receive (no global process-group state);
// sub-groups come from split().
//
// Backends: MPI for CPU tensors (src/distributed/mpi_communicator.cpp) and NCCL for CUDA tensors
// (src/distributed/nccl_communicator.cpp, CUDA builds only; bootstrapped by broadcasting NCCL's
// unique id over an MPI communicator).
//
// Contract shared by every backend:
// - Tensors are contiguous; every rank passes the same dtype and element counts (the public
//   methods check locally; with CommOptions::check_consistency the counts and dtypes are also
//   compared across ranks before the operation, and a mismatch is a td::Error naming each
//   rank's values instead of undefined behaviour or a hang).
// - Every collective is issued in the same order on every rank of the group.
// - async_op=false blocks until done and returns nullptr; async_op=true returns a Work at once.
//   The operation then runs concurrently with the caller (a progress thread drives it), and
//   the tensors must not be read or written until wait() returns. The Work keeps them alive.
// - Every blocking wait is bounded by the communicator's timeout; when it expires the wait
//   throws a td::Error naming the rank, the group, the operation and the element count
//   ("rank 1 of group 'dp' (size 2): all_reduce of 4096 float32 timed out after 300 s").
// - kAvg divides by size() after summation (integer dtypes: truncating division).
// - Every communicator counts its own traffic (stats()): Note [Communication accounting] in
//   src/distributed/communicator.cpp.
// - bool tensors reduce logically (like PyTorch's NCCL group): Sum and Max are OR, Min is AND;
//   Avg is an error. bf16/f16 reduce in fp32 with one rounding per pairwise combine (Note
//   [Reduced-precision reductions] in src/distributed/mpi_communicator.cpp).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::distributed {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(const std::string& s);  // "sum" | "avg" | "max" | "min"

// The handle of an asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation has completed (rethrowing its failure) or the timeout expired.
  virtual void wait() = 0;
  // Non-blocking; true once wait() would return immediately.
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// 5 minutes, or the environment's TD_COMM_TIMEOUT_S (seconds, may be fractional) when set.
std::chrono::milliseconds default_comm_timeout();

struct CommOptions {
  std::chrono::milliseconds timeout = default_comm_timeout();
  bool check_consistency = true;  // cross-rank dtype/count check before each collective
};

// What one communicator has done since it was created or since reset_stats() (Note
// [Communication accounting] in src/distributed/communicator.cpp).
struct CommStats {
  int64_t calls = 0;     // operations issued: collectives, barriers, sends and receives
  int64_t bytes = 0;     // their input bytes (all_gather: this rank's part; recv: its buffer)
  double seconds = 0.0;  // time the caller was blocked in them or in their Work::wait()
};

namespace comm_detail {
// Shared by a communicator and the Works it returned (a Work may outlive its communicator).
struct CommCounters {
  std::atomic<int64_t> calls{0}, bytes{0}, nanoseconds{0};
};
}  // namespace comm_detail

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's name in messages ("world", "tp", "dp", ...).
  const std::string& name() const { return name_; }
  const CommOptions& options() const { return options_; }
  void set_timeout(std::chrono::milliseconds timeout) { options_.timeout = timeout; }
  // "mpi" | "nccl"
  virtual const char* backend() const = 0;
  // "rank 1 of group 'dp' (size 2)": how every message of this communicator names it.
  std::string where() const;

  // Counts of this communicator's operations since creation or the last reset_stats(). Safe to
  // call from any thread; each field is read atomically (not the three together).
  CommStats stats() const;
  void reset_stats();

  // In place: every rank ends with the reduction of all ranks' `t`.
  WorkPtr all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum, bool async_op = false);
  // out has size() * in.numel() elements: rank i's `in` lands at [i * n, (i + 1) * n).
  WorkPtr all_gather(Tensor& out, const Tensor& in, bool async_op = false);
  // in has size() * out.numel() elements: rank i receives the reduction of chunk i.
  WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum,
                         bool async_op = false);
  // root's `t` is copied into every other rank's `t`.
  WorkPtr broadcast(Tensor& t, int root, bool async_op = false);
  // Point to point; the receiver's tensor must have the sender's dtype and count.
  WorkPtr send(const Tensor& t, int dst, int tag = 0, bool async_op = false);
  WorkPtr recv(Tensor& t, int src, int tag = 0, bool async_op = false);
  // Rank r sends in[in_offsets(r)[j] .. +in_splits[j]) to rank j and receives from rank j
  // out_splits[j] elements, stored back to back in rank order. Splits count elements along the
  // flattened tensors; empty splits mean equal splits (numel / size()).
  WorkPtr all_to_all(Tensor& out, const Tensor& in, std::vector<int64_t> out_splits = {},
                     std::vector<int64_t> in_splits = {}, bool async_op = false);
  void barrier();

  // MPI_Comm_split semantics: ranks with equal color form a group ordered by (key, old rank).
  // A negative color returns nullptr (not a member). Collective over this communicator.
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name);

 protected:
  Communicator(int rank, int size, std::string name, CommOptions options)
      : rank_(rank),
        size_(size),
        name_(std::move(name)),
        options_(options),
        counters_(std::make_shared<comm_detail::CommCounters>()) {}

  // Backends implement these; arguments are already checked (contiguous, counts, dtypes,
  // peers in range, splits valid) and, where asked, cross-checked between ranks.
  virtual WorkPtr do_all_reduce(Tensor& t, ReduceOp op, bool async_op) = 0;
  virtual WorkPtr do_all_gather(Tensor& out, const Tensor& in, bool async_op) = 0;
  virtual WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async_op) = 0;
  virtual WorkPtr do_broadcast(Tensor& t, int root, bool async_op) = 0;
  virtual WorkPtr do_send(const Tensor& t, int dst, int tag, bool async_op) = 0;
  virtual WorkPtr do_recv(Tensor& t, int src, int tag, bool async_op) = 0;
  virtual WorkPtr do_all_to_all(Tensor& out, const Tensor& in,
                                const std::vector<int64_t>& out_splits,
                                const std::vector<int64_t>& in_splits, bool async_op) = 0;
  virtual void do_barrier() = 0;
  virtual std::shared_ptr<Communicator> do_split(int color, int key, const std::string& name) = 0;

  // Cross-rank consistency check (a small all-gather of op code, dtype, count and `aux`: the
  // reduce op or the root); throws a td::Error listing every rank's values when they differ, on
  // every rank alike. Backends call it when options().check_consistency.
  virtual void check_consistency(const char* op, DType dtype, int64_t count, int64_t aux = 0) = 0;

 private:
  // Runs `issue` (a do_* call), adding its time, one call and `bytes` to the counters, and
  // wraps an asynchronous Work so that its wait() time is counted too.
  template <typename F>
  WorkPtr counted(size_t bytes, F&& issue);

  int rank_;
  int size_;
  std::string name_;
  CommOptions options_;
  std::shared_ptr<comm_detail::CommCounters> counters_;
};

using CommPtr = std::shared_ptr<Communicator>;

// The world communicator over MPI_COMM_WORLD. Initializes MPI (MPI_THREAD_MULTIPLE) on first
// use; every call returns a new handle over the same world. td::Error when this build has no
// MPI (TD_WITH_MPI=OFF).
CommPtr mpi_world(CommOptions options = {});
// True when the library was built with the MPI backend.
bool mpi_available();
// Finalizes MPI if this library initialized it (also done at exit). After a failed collective
// the process should call abort_world() instead: MPI_Finalize could wait on dead peers.
void finalize();
// Ends every rank of the job with `code` (MPI_Abort): used after an error that left the
// communicators in an unknown state (a timeout, a peer that died).
[[noreturn]] void abort_world(int code);

// A NCCL communicator over the same ranks as `mpi_comm` (collective over it: rank 0 creates
// NCCL's unique id and broadcasts it), on CUDA device `device`, for CUDA tensors. Collectives
// run on a communication stream ordered after the compute stream (Note [NCCL streams] in
// src/distributed/nccl_communicator.cpp). td::Error in a build without CUDA.
CommPtr nccl_communicator(const CommPtr& mpi_comm, int device, CommOptions options = {});

}  // namespace td::distributed
