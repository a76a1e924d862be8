#pragma once
// The MPI backend of td::distributed::Communicator (internal header; MPI builds only).
//
// Note [Progress thread]: every operation is issued with non-blocking MPI (MPI_Iallreduce, ...)
// on the caller's thread, so all ranks issue in program order. A blocking call then polls its
// requests itself (MPI_Testall with a deadline). An asynchronous call hands its requests to the
// process's one ProgressEngine, whose thread polls every pending operation with MPI_Testall
// until it completes: OpenMPI advances a non-blocking collective only inside MPI calls, so
// without that thread an MPI_Iallreduce would sit still while the caller computes. Polling
// backs off (spin, then sched_yield, then short sleeps) so that oversubscribed ranks (CI runs 4
// ranks on 2 cores) leave the cores to the ranks that have work. MPI runs in
// MPI_THREAD_MULTIPLE. An operation whose wait timed out stays with the engine (its buffers
// alive) and may still complete if the late peers join.
#include "tardelli/distributed/communicator.h"

#if TD_WITH_MPI
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace td::distributed::mpi {

// An issued MPI operation: its requests, what to do once they complete (Avg's division, a
// received count's check) and the tensors it reads or writes, kept alive until then.
struct Op {
  std::string what;  // "rank 0 of group 'world' (size 2): all_reduce of 4096 float32"
  std::vector<MPI_Request> requests;
  std::vector<MPI_Status> statuses;
  std::function<void(Op&)> finish;
  std::vector<Tensor> keep_alive;

  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  std::exception_ptr error;

  // Tests the requests once; on completion runs `finish`, marks the op done and returns true.
  // Only the op's current owner calls it (the issuing thread, then the progress engine).
  bool test();
  // Blocks until done (rethrowing the op's failure) or the deadline (timeout error).
  void wait_until(std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds timeout);

 private:
  void complete(std::exception_ptr e);
};

class ProgressEngine {
 public:
  ProgressEngine();
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;
  void submit(std::shared_ptr<Op> op);
  // Joins the thread; operations still pending are abandoned (their buffers leak).
  void stop();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Op>> incoming_;
  bool stop_ = false;
  std::thread thread_;
};

// Functions finalize() runs before it finalizes MPI (threads of other layers that call MPI, such
// as the tag matcher's, stop there). Returns an id for remove_finalize_hook.
int add_finalize_hook(std::function<void()> hook);
void remove_finalize_hook(int id);

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor) unless it is MPI_COMM_WORLD.
  MpiCommunicator(MPI_Comm comm, std::string name, CommOptions options);
  ~MpiCommunicator() override;
  const char* backend() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }
  // Non-blocking: true and the sender's rank when a message with `tag` from any rank is waiting
  // to be received (MPI_Iprobe). For the tag matcher's headers (distributed/tag_matching.h).
  bool probe(int tag, int* src) const;

 protected:
  WorkPtr do_all_reduce(Tensor& t, ReduceOp op, bool async_op) override;
  WorkPtr do_all_gather(Tensor& out, const Tensor& in, bool async_op) override;
  WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async_op) override;
  WorkPtr do_broadcast(Tensor& t, int root, bool async_op) override;
  WorkPtr do_send(const Tensor& t, int dst, int tag, bool async_op) override;
  WorkPtr do_recv(Tensor& t, int src, int tag, bool async_op) override;
  WorkPtr do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                        const std::vector<int64_t>& in_splits, bool async_op) override;
  void do_barrier() override;
  std::shared_ptr<Communicator> do_split(int color, int key, const std::string& name) override;
  void check_consistency(const char* op, DType dtype, int64_t count, int64_t aux) override;

 private:
  std::shared_ptr<Op> make_op(const std::string& what, std::vector<Tensor> keep_alive) const;
  // Blocking: polls until done or the timeout; async: hands the op to the progress engine.
  WorkPtr run(std::shared_ptr<Op> op, bool async_op);
  // A blocking all-gather of a few int64 per rank (the consistency checks).
  std::vector<int64_t> allgather_small(const std::vector<int64_t>& mine, const std::string& what);

  MPI_Comm comm_;
};

}  // namespace td::distributed::mpi
#endif  // TD_WITH_MPI
