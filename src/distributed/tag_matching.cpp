// Tagged point-to-point over an ordered transport (Note [Tag matching] in the header).
#include "tardelli/distributed/tag_matching.h"

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/factory.h"

#if TD_WITH_MPI
#include "mpi_communicator.h"
#endif

namespace td::distributed {

namespace {

using Clock = std::chrono::steady_clock;

// A header: [tag, numel, dtype, token words, token...] (fixed size).
constexpr int64_t kHeaderFixed = 4;
constexpr int64_t kHeaderWords = kHeaderFixed + OrderedTransport::kMaxTokenWords;

std::string seconds(std::chrono::milliseconds ms) {
  return detail::str_cat(static_cast<double>(ms.count()) / 1000.0);
}

// What a caller's Work waits for: the matching thread hands it the transport's Work (or a
// failure), and, for a message that came before its receive, the copy out of its buffer.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool issued = false;
  WorkPtr inner;
  std::exception_ptr error;
  Tensor buffer;  // an unexpected message's buffer, copied into `target` after inner completes
  Tensor target;
  std::vector<Tensor> keep_alive;

  void fulfil(WorkPtr w) {
    {
      std::lock_guard<std::mutex> lock(mu);
      inner = std::move(w);
      issued = true;
    }
    cv.notify_all();
  }
  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      error = std::move(e);
      issued = true;
    }
    cv.notify_all();
  }
};

class MatchedWork final : public Work {
 public:
  MatchedWork(std::shared_ptr<Pending> p, std::string what, std::chrono::milliseconds timeout)
      : p_(std::move(p)), what_(std::move(what)), timeout_(timeout) {}

  void wait() override {
    if (done_) return;
    {
      std::unique_lock<std::mutex> lock(p_->mu);
      const bool ok = p_->cv.wait_for(lock, timeout_, [&] { return p_->issued; });
      TD_CHECK(ok, what_, " timed out after ", seconds(timeout_),
               " s: the peer never sent the matching message (a peer died, or the ranks' tags "
               "or counts disagree)");
      if (p_->error) std::rethrow_exception(p_->error);
    }
    if (p_->inner) p_->inner->wait();
    if (p_->buffer.defined()) {
      autograd::NoGradGuard ng;
      p_->target.copy_(p_->buffer);
    }
    p_->keep_alive.clear();
    p_->buffer = Tensor();
    p_->target = Tensor();
    done_ = true;
  }

  bool is_completed() override {
    if (done_) return true;
    std::lock_guard<std::mutex> lock(p_->mu);
    if (!p_->issued) return false;
    return p_->error != nullptr || p_->inner == nullptr || p_->inner->is_completed();
  }

 private:
  std::shared_ptr<Pending> p_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  bool done_ = false;
};

}  // namespace

struct TagMatcher::State {
  struct Outgoing {
    Tensor t;
    int dst, tag;
    OrderedTransport::Fence fence;
    std::shared_ptr<Pending> p;
  };
  struct Posted {
    Tensor t;
    OrderedTransport::Fence fence;
    std::shared_ptr<Pending> p;
  };
  struct Arrived {
    Tensor buffer;
    WorkPtr work;
  };
  using Key = std::pair<int, int>;  // (peer, tag)

  CommPtr control;  // headers (a duplicate of the group)
  std::unique_ptr<OrderedTransport> transport;
  std::string where;
  std::chrono::milliseconds timeout;
  int size = 1;

  std::mutex mu;  // guards everything below
  std::deque<Outgoing> outbox;
  std::map<Key, std::deque<Posted>> posted;
  std::map<Key, std::deque<Arrived>> unexpected;
  std::exception_ptr failed;  // the thread's failure: every later call rethrows it
  std::vector<bool> send_open, recv_open;
  std::vector<WorkPtr> header_sends;  // only the thread touches it

  std::once_flag started;
  std::atomic<bool> stop{false};
  std::atomic<bool> poke{false};
  std::thread thread;
  std::mutex thread_mu;  // guards joining
  int finalize_hook = -1;

  void start() {
    std::call_once(started, [this] {
      thread = std::thread([this] { loop(); });
#if TD_WITH_MPI
      // The thread calls MPI: it must end before MPI does (at exit, a static matcher's
      // destructor would run after the atexit finalize).
      finalize_hook = mpi::add_finalize_hook([this] { join(); });
#endif
    });
  }

  void join() {
    std::lock_guard<std::mutex> lock(thread_mu);
    stop = true;
    if (thread.joinable()) thread.join();
  }

  void check_failed() {
    std::lock_guard<std::mutex> lock(mu);
    if (failed) std::rethrow_exception(failed);
  }

  bool probe(int* src) {
#if TD_WITH_MPI
    return static_cast<const mpi::MpiCommunicator&>(*control).probe(0, src);
#else
    (void)src;
    return false;
#endif
  }

  void send_header(int dst, int tag, const Tensor& t, const std::vector<int64_t>& token) {
    std::vector<int64_t> h(kHeaderWords, 0);
    h[0] = tag;
    h[1] = t.numel();
    h[2] = static_cast<int64_t>(t.dtype());
    h[3] = static_cast<int64_t>(token.size());
    std::copy(token.begin(), token.end(), h.begin() + kHeaderFixed);
    Tensor ht = from_vector(h, {kHeaderWords});
    header_sends.push_back(control->send(ht, dst, 0, /*async_op=*/true));
  }

  // Issues one queued send: its header (with a token on the channel's first message), the
  // channel's opening, then the data.
  void issue_send(Outgoing& o) {
    try {
      std::vector<int64_t> token;
      bool opening = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        opening = !send_open[o.dst];
      }
      if (opening) {
        token = transport->channel_token(o.dst);
        TD_CHECK(static_cast<int64_t>(token.size()) <= OrderedTransport::kMaxTokenWords, where,
                 ": channel token of ", token.size(), " words is too long");
      }
      send_header(o.dst, o.tag, o.t, token);
      if (opening) {
        transport->open_send(o.dst, token);
        std::lock_guard<std::mutex> lock(mu);
        send_open[o.dst] = true;
      }
      o.p->fulfil(o.t.numel() > 0 ? transport->send(o.t, o.dst, o.fence) : nullptr);
    } catch (...) {
      o.p->fail(std::current_exception());
      throw;
    }
  }

  // Takes one header from `src` and issues its data's receive (Note [Tag matching]).
  void take_header(int src) {
    Tensor ht = empty({kHeaderWords}, {DType::Int64});
    control->recv(ht, src, 0);
    const std::vector<int64_t> h = to_vector<int64_t>(ht);
    const int tag = static_cast<int>(h[0]);
    const int64_t numel = h[1];
    const auto dtype = static_cast<DType>(h[2]);
    if (h[3] > 0) {
      transport->open_recv(
          src, std::vector<int64_t>(h.begin() + kHeaderFixed, h.begin() + kHeaderFixed + h[3]));
      std::lock_guard<std::mutex> lock(mu);
      recv_open[src] = true;
    }
    std::unique_lock<std::mutex> lock(mu);
    TD_CHECK(recv_open[src], where, ": a message from rank ", src,
             " came before its channel was opened");
    auto it = posted.find({src, tag});
    if (it != posted.end() && !it->second.empty()) {
      Posted r = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) posted.erase(it);
      lock.unlock();
      if (r.t.numel() == numel && r.t.dtype() == dtype) {
        r.p->fulfil(numel > 0 ? transport->recv(r.t, src, r.fence) : nullptr);
        return;
      }
      // Keep the channel's order: the data still has to be taken.
      Tensor sink = transport->buffer(numel, dtype);
      WorkPtr w = numel > 0 ? transport->recv(sink, src, transport->fence()) : nullptr;
      r.p->keep_alive.push_back(sink);
      r.p->fail(std::make_exception_ptr(Error(detail::str_cat(
          where, ": recv of ", r.t.numel(), " ", dtype_name(r.t.dtype()), " from rank ", src,
          " (tag ", tag, "): the sender sent ", numel, " ", dtype_name(dtype),
          " (sender and receiver must agree on dtype and count)"))));
      if (w) w->wait();
      return;
    }
    // Unexpected: received into its own buffer, under the lock, so a receive posted meanwhile
    // finds it.
    Tensor buf = transport->buffer(numel, dtype);
    WorkPtr w = numel > 0 ? transport->recv(buf, src, transport->fence()) : nullptr;
    unexpected[{src, tag}].push_back({std::move(buf), std::move(w)});
  }

  void loop() {
    try {
      transport->bind_thread();
      Clock::time_point last = Clock::now();
      while (!stop.load()) {
        bool progressed = false;
        std::deque<Outgoing> sends;
        {
          std::lock_guard<std::mutex> lock(mu);
          sends.swap(outbox);
        }
        for (Outgoing& o : sends) {
          issue_send(o);
          progressed = true;
        }
        int src = -1;
        while (probe(&src)) {
          take_header(src);
          progressed = true;
        }
        std::erase_if(header_sends, [](WorkPtr& w) {
          if (!w->is_completed()) return false;
          w->wait();
          return true;
        });
        if (progressed || poke.exchange(false)) {
          last = Clock::now();
        } else if (Clock::now() - last < std::chrono::milliseconds(2)) {
          sched_yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
    } catch (...) {
      std::exception_ptr e = std::current_exception();
      std::deque<Outgoing> sends;
      std::map<Key, std::deque<Posted>> receives;
      {
        std::lock_guard<std::mutex> lock(mu);
        failed = e;
        sends.swap(outbox);
        receives.swap(posted);
      }
      for (Outgoing& o : sends) o.p->fail(e);
      for (auto& [k, q] : receives) {
        for (Posted& r : q) r.p->fail(e);
      }
    }
  }
};

TagMatcher::TagMatcher(const CommPtr& group, std::unique_ptr<OrderedTransport> transport,
                       std::string where, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()) {
  TD_CHECK(group != nullptr && std::string(group->backend()) == "mpi",
           "TagMatcher: headers travel over an MPI communicator");
  state_->control = group->split(0, group->rank(), group->name() + "-headers");
  state_->transport = std::move(transport);
  state_->where = std::move(where);
  state_->timeout = timeout;
  state_->size = group->size();
  state_->send_open.assign(static_cast<size_t>(group->size()), false);
  state_->recv_open.assign(static_cast<size_t>(group->size()), false);
}

TagMatcher::~TagMatcher() {
#if TD_WITH_MPI
  if (state_->finalize_hook >= 0) mpi::remove_finalize_hook(state_->finalize_hook);
#endif
  state_->join();
}

WorkPtr TagMatcher::send(const Tensor& t, int dst, int tag) {
  State& s = *state_;
  s.check_failed();
  auto p = std::make_shared<Pending>();
  p->keep_alive.push_back(t);
  const std::string what =
      detail::str_cat(s.where, ": send of ", t.numel(), " ", dtype_name(t.dtype()), " to rank ",
                      dst, " (tag ", tag, ")");
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.outbox.push_back({t, dst, tag, s.transport->fence(), p});
  }
  s.poke = true;
  s.start();
  return std::make_shared<MatchedWork>(std::move(p), what, s.timeout);
}

WorkPtr TagMatcher::recv(Tensor& t, int src, int tag) {
  State& s = *state_;
  s.check_failed();
  auto p = std::make_shared<Pending>();
  const std::string what =
      detail::str_cat(s.where, ": recv of ", t.numel(), " ", dtype_name(t.dtype()), " from rank ",
                      src, " (tag ", tag, ")");
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.unexpected.find({src, tag});
    if (it != s.unexpected.end() && !it->second.empty()) {
      State::Arrived a = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) s.unexpected.erase(it);
      TD_CHECK(a.buffer.numel() == t.numel() && a.buffer.dtype() == t.dtype(), what,
               ": the sender sent ", a.buffer.numel(), " ", dtype_name(a.buffer.dtype()),
               " (sender and receiver must agree on dtype and count)");
      p->buffer = a.buffer.view(t.sizes());
      p->target = t;
      p->fulfil(std::move(a.work));
    } else {
      p->keep_alive.push_back(t);
      s.posted[{src, tag}].push_back({t, s.transport->fence(), p});
    }
  }
  s.poke = true;
  s.start();
  return std::make_shared<MatchedWork>(std::move(p), what, s.timeout);
}

// ---- the MPI stand-in ----

namespace {

// Untagged, ordered MPI messages: MPI never overtakes between two ranks on one communicator and
// tag, which is the order NCCL's channels keep.
class MpiOrderedTransport final : public OrderedTransport {
 public:
  explicit MpiOrderedTransport(CommPtr data) : data_(std::move(data)) {}
  Fence fence() override { return nullptr; }
  std::vector<int64_t> channel_token(int peer) override { return {kMagic, data_->rank(), peer}; }
  void open_send(int, const std::vector<int64_t>&) override {}
  void open_recv(int peer, const std::vector<int64_t>& token) override {
    TD_CHECK(
        token.size() == 3 && token[0] == kMagic && token[1] == peer && token[2] == data_->rank(),
        data_->where(), ": channel token from rank ", peer, " is not for this channel");
  }
  WorkPtr send(const Tensor& t, int peer, const Fence&) override {
    return data_->send(t, peer, 0, /*async_op=*/true);
  }
  WorkPtr recv(Tensor& t, int peer, const Fence&) override {
    return data_->recv(t, peer, 0, /*async_op=*/true);
  }
  Tensor buffer(int64_t numel, DType dtype) override { return empty({numel}, {dtype}); }

 private:
  static constexpr int64_t kMagic = 0x7a6d;
  CommPtr data_;
};

class TagMatchedMpi final : public Communicator {
 public:
  explicit TagMatchedMpi(CommPtr mpi)
      : Communicator(mpi->rank(), mpi->size(), mpi->name(), mpi->options()),
        mpi_(std::move(mpi)),
        p2p_(mpi_,
             std::make_unique<MpiOrderedTransport>(
                 mpi_->split(0, mpi_->rank(), mpi_->name() + "-data")),
             where(), options().timeout) {}
  const char* backend() const override { return "mpi-tag-matched"; }

 protected:
  WorkPtr do_all_reduce(Tensor& t, ReduceOp op, bool async_op) override {
    return mpi_->all_reduce(t, op, async_op);
  }
  WorkPtr do_all_gather(Tensor& out, const Tensor& in, bool async_op) override {
    return mpi_->all_gather(out, in, async_op);
  }
  WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async_op) override {
    return mpi_->reduce_scatter(out, in, op, async_op);
  }
  WorkPtr do_broadcast(Tensor& t, int root, bool async_op) override {
    return mpi_->broadcast(t, root, async_op);
  }
  WorkPtr do_send(const Tensor& t, int dst, int tag, bool async_op) override {
    WorkPtr w = p2p_.send(t, dst, tag);
    if (async_op) return w;
    w->wait();
    return nullptr;
  }
  WorkPtr do_recv(Tensor& t, int src, int tag, bool async_op) override {
    WorkPtr w = p2p_.recv(t, src, tag);
    if (async_op) return w;
    w->wait();
    return nullptr;
  }
  WorkPtr do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                        const std::vector<int64_t>& in_splits, bool async_op) override {
    return mpi_->all_to_all(out, in, out_splits, in_splits, async_op);
  }
  void do_barrier() override { mpi_->barrier(); }
  CommPtr do_split(int color, int key, const std::string& name) override {
    CommPtr sub = mpi_->split(color, key, name);
    if (!sub) return nullptr;
    return std::make_shared<TagMatchedMpi>(std::move(sub));
  }
  void check_consistency(const char*, DType, int64_t, int64_t) override {}

 private:
  CommPtr mpi_;
  TagMatcher p2p_;
};

}  // namespace

CommPtr tag_matched_mpi(const CommPtr& mpi) {
  TD_CHECK(mpi != nullptr && std::string(mpi->backend()) == "mpi",
           "tag_matched_mpi: needs an MPI communicator");
  return std::make_shared<TagMatchedMpi>(mpi);
}

}  // namespace td::distributed
