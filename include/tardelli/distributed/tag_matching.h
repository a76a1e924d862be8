#pragma once
// Tagged point-to-point messages over a transport that has no tags: NCCL's ncclSend/ncclRecv
// pair the i-th send from rank a to rank b with the i-th receive b posts from a, in issue order.
// The pipeline runtime and context parallelism post receives by tag (micro-batch, direction,
// virtual stage) in an order that need not be the sender's order, so NCCL alone would pair the
// wrong messages or hang.
//
// Note [Tag matching]: every message travels as a small header over MPI (tag, count, dtype and,
// on a channel's first message, the token that opens it) plus its data over the ordered
// transport. A channel is one direction between two ranks (sender -> receiver: its own NCCL
// communicator of two ranks and its own stream, opened on the first message), so a receive
// that waits never holds back a send in the other direction, as one stream per pair would.
// One matching thread per TagMatcher (started on the first send or receive) issues the
// transport's operations: a channel's data operations are issued in its headers' order on both
// ends, which is how they pair. A send is queued by the caller and issued by the thread (its
// header, then its data), so no caller ever blocks on a peer. On the receiving end the thread
// takes the headers as they arrive: a header whose (source, tag) has a posted receive is
// received straight into that tensor; one that has none is received into a buffer of its own
// (an unexpected message, as MPI keeps them) and the later receive copies it out. So any order
// of posting that MPI's tags would match is matched, at the cost of one device copy for a message
// that arrives before its receive. Receives of one (source, tag) match in order, as in MPI.
// A header whose count or dtype differs from the posted receive fails that receive with both
// ranks' values (NCCL cannot detect it: it would hang or write past the buffer).
//
// Ordering against compute: the transport's fence() marks what the caller has issued so far (a
// CUDA event on the compute stream); each operation waits for its own fence, taken when it was
// posted, so a send reads the finished tensor and a receive never overwrites memory the compute
// stream still reads.
//
// The thread polls for headers (yielding for 2 ms after its last work, then sleeping 50 us
// between polls), so a matcher that has been used costs a little CPU until it is destroyed.
//
// Limits: a channel is opened by its first message, and the thread waits there until the peer
// joins, which happens on the peer's first send or receive on this communicator. Messages to
// other peers wait meanwhile. Ranks that use point-to-point on a communicator do so early in
// every layout of the library, so this is a start-up cost, not a hang.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/distributed/communicator.h"

namespace td::distributed {

// An ordered, untagged point-to-point transport between the ranks of one group.
class OrderedTransport {
 public:
  using Fence = std::shared_ptr<void>;
  virtual ~OrderedTransport() = default;
  // What an operation posted now must follow (nullptr: nothing). Called by the posting thread.
  virtual Fence fence() = 0;
  // The rest run on the matching thread only.
  // Once, before any other call there (CUDA: selects the device).
  virtual void bind_thread() {}
  // A token for a new channel from this rank to `peer`, at most kMaxTokenWords words.
  virtual std::vector<int64_t> channel_token(int peer) = 0;
  // Open the channel this rank -> peer / peer -> this rank; both may block until the peer joins.
  virtual void open_send(int peer, const std::vector<int64_t>& token) = 0;
  virtual void open_recv(int peer, const std::vector<int64_t>& token) = 0;
  // Issue a data operation on the channel to / from `peer`, after `after`. The Work completes
  // when the data has arrived (recv) or may be reused (send). nullptr: complete at once.
  virtual WorkPtr send(const Tensor& t, int peer, const Fence& after) = 0;
  virtual WorkPtr recv(Tensor& t, int peer, const Fence& after) = 0;
  // A buffer for a message that arrived before its receive was posted.
  virtual Tensor buffer(int64_t numel, DType dtype) = 0;

  static constexpr int kMaxTokenWords = 16;  // NCCL's unique id is 128 bytes
};

// Tagged send/recv over `transport` for the ranks of `group` (an MPI communicator: headers
// travel over a duplicate of it). Constructing one is collective over `group`. Errors name
// `where` ("rank 1 of group 'pp' (size 2)"); receives time out after `timeout`.
class TagMatcher {
 public:
  TagMatcher(const CommPtr& group, std::unique_ptr<OrderedTransport> transport, std::string where,
             std::chrono::milliseconds timeout);
  ~TagMatcher();
  TagMatcher(const TagMatcher&) = delete;
  TagMatcher& operator=(const TagMatcher&) = delete;

  // Asynchronous: the Work's wait() returns when the message has left `t` (send) or has been
  // written into `t` (recv). `t` is contiguous; the caller has checked the peer.
  WorkPtr send(const Tensor& t, int dst, int tag);
  WorkPtr recv(Tensor& t, int src, int tag);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// The CPU stand-in of the NCCL path (Note [Tag matching]): an MPI communicator whose sends and
// receives go through a TagMatcher over untagged, ordered MPI messages; collectives are `mpi`'s.
// It lets multi-rank tests run every layout's point-to-point traffic through the matching that
// NCCL uses, on machines without GPUs. split() gives such communicators too.
CommPtr tag_matched_mpi(const CommPtr& mpi);

}  // namespace td::distributed
