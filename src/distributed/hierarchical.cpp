#include "tardelli/distributed/hierarchical.h"

#include <algorithm>
#include <functional>
#include <map>

#include "distributed/worker.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {

namespace {

// Note [Two-level worker]: a two-level collective is several collectives in a row, so it runs
// on a thread of its own (worker.h): every operation of the communicator (collective or not) is
// queued to that worker and runs there in submission order, which is the same order on every
// rank; the groups underneath (node, cross-node, a private copy of the flat group) are only ever
// used by the worker, so their operations are issued in one order too. An async_op request
// returns at once with a Work that completes when the worker has run it (DDP's buckets then
// reduce while backward goes on); a blocking request waits for it. A failure (a timeout
// underneath) is rethrown by wait().
//
// Note [Two-level collectives].
class HierarchicalCommunicator final : public Communicator {
 public:
  HierarchicalCommunicator(const std::string& name, CommPtr flat, CommPtr intra, CommPtr cross,
                           int nodes, int per_node, bool equal)
      : Communicator(flat->rank(), flat->size(), name, flat->options()),
        flat_(std::move(flat)),
        intra_(std::move(intra)),
        cross_(std::move(cross)),
        nodes_(nodes),
        per_node_(per_node),
        equal_(equal) {}

  const char* backend() const override { return flat_->backend(); }
  const CommPtr& cross() const { return cross_; }

 protected:
  WorkPtr do_all_reduce(Tensor& t, ReduceOp op, bool async_op) override {
    return run(async_op, [this, t, op]() mutable { all_reduce_now(t, op); });
  }
  WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async_op) override {
    return run(async_op, [this, out, in, op]() mutable { reduce_scatter_now(out, in, op); });
  }
  WorkPtr do_all_gather(Tensor& out, const Tensor& in, bool async_op) override {
    return run(async_op, [this, out, in]() mutable { all_gather_now(out, in); });
  }
  WorkPtr do_broadcast(Tensor& t, int root, bool async_op) override {
    return run(async_op, [this, t, root]() mutable { flat_->broadcast(t, root); });
  }
  WorkPtr do_send(const Tensor& t, int dst, int tag, bool async_op) override {
    return run(async_op, [this, t, dst, tag] { flat_->send(t, dst, tag); });
  }
  WorkPtr do_recv(Tensor& t, int src, int tag, bool async_op) override {
    return run(async_op, [this, t, src, tag]() mutable { flat_->recv(t, src, tag); });
  }
  WorkPtr do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                        const std::vector<int64_t>& in_splits, bool async_op) override {
    return run(async_op, [this, out, in, out_splits, in_splits]() mutable {
      flat_->all_to_all(out, in, out_splits, in_splits);
    });
  }
  void do_barrier() override {
    run(false, [this] { flat_->barrier(); });
  }
  CommPtr do_split(int color, int key, const std::string& name) override {
    CommPtr out;
    run(false, [&] { out = flat_->split(color, key, name); });
    return out;
  }
  // The groups underneath check their own calls.
  void check_consistency(const char*, DType, int64_t, int64_t) override {}

 private:
  // Note [Two-level worker]: queued; a blocking request waits here.
  WorkPtr run(bool async_op, std::function<void()> f) {
    auto w = std::make_shared<QueuedWork>(worker_.submit(std::move(f)));
    if (!async_op) w->wait();
    return w;
  }

  void all_reduce_now(Tensor& t, ReduceOp op) {
    if (op == ReduceOp::Max || op == ReduceOp::Min || nodes_ == 1 || per_node_ == 1) {
      flat_->all_reduce(t, op);
      return;
    }
    if (equal_) {
      const int64_t n = t.numel(), L = per_node_, chunk = (n + L - 1) / L;
      Tensor buf = zeros({L * chunk}, {t.dtype(), t.device(), false});
      buf.narrow(0, 0, n).copy_(t.reshape({n}));
      Tensor part = Tensor::empty({chunk}, t.dtype(), t.device());
      intra_->reduce_scatter(part, buf, ReduceOp::Sum);
      cross_->all_reduce(part, ReduceOp::Sum);
      intra_->all_gather(buf, part);
      t.copy_(buf.narrow(0, 0, n).view(t.sizes()));
    } else {
      intra_->all_reduce(t, ReduceOp::Sum);
      if (cross_) cross_->all_reduce(t, ReduceOp::Sum);
      intra_->broadcast(t, 0);
    }
    if (op == ReduceOp::Avg) mul_(t, 1.0 / size());
  }

  void reduce_scatter_now(Tensor& out, const Tensor& in, ReduceOp op) {
    if (!equal_ || op == ReduceOp::Max || op == ReduceOp::Min || nodes_ == 1 || per_node_ == 1) {
      flat_->reduce_scatter(out, in, op);
      return;
    }
    const int64_t S = out.numel(), M = nodes_, L = per_node_;
    // Blocks [M][L][S] (member m L + l's block at m, l) reordered to [L][M][S].
    Tensor y = in.reshape({M, L, S}).permute({1, 0, 2}).contiguous().reshape({L * M * S});
    Tensor mid = Tensor::empty({M * S}, in.dtype(), in.device());
    intra_->reduce_scatter(mid, y, ReduceOp::Sum);    // chunk l: {block m L + l : m}, node sum
    cross_->reduce_scatter(out, mid, ReduceOp::Sum);  // block m L + l, summed over nodes
    if (op == ReduceOp::Avg) mul_(out, 1.0 / size());
  }

  void all_gather_now(Tensor& out, const Tensor& in) {
    if (!equal_ || nodes_ == 1 || per_node_ == 1) {
      flat_->all_gather(out, in);
      return;
    }
    const int64_t S = in.numel(), M = nodes_, L = per_node_;
    Tensor mid = Tensor::empty({M * S}, in.dtype(), in.device());
    cross_->all_gather(mid, in.reshape({S}));  // [M][S] of local index l
    Tensor all = Tensor::empty({L * M * S}, in.dtype(), in.device());
    intra_->all_gather(all, mid);  // [L][M][S]
    out.copy_(all.reshape({L, M, S}).permute({1, 0, 2}).contiguous().view(out.sizes()));
  }

  CommPtr flat_, intra_, cross_;
  int nodes_, per_node_;
  bool equal_;
  Worker worker_;  // last: destroyed (joined) first, while the groups it uses still exist
};

}  // namespace

std::vector<int> nodes_of(const std::vector<int>& world_ranks, int ranks_per_node) {
  TD_CHECK(ranks_per_node >= 1, "nodes_of: ranks_per_node must be >= 1, got ", ranks_per_node);
  std::vector<int> out;
  for (int r : world_ranks) {
    TD_CHECK(r >= 0, "nodes_of: negative world rank ", r);
    out.push_back(r / ranks_per_node);
  }
  return out;
}

CommPtr hierarchical(const CommPtr& flat, const std::vector<int>& nodes) {
  TD_CHECK(flat != nullptr, "hierarchical: the communicator is null");
  TD_CHECK(static_cast<int>(nodes.size()) == flat->size(), "hierarchical (", flat->where(),
           "): ", nodes.size(), " node ids for ", flat->size(), " members");
  TD_CHECK(std::is_sorted(nodes.begin(), nodes.end()), "hierarchical (", flat->where(),
           "): the members' node ids must not decrease with the rank (consecutive ranks share "
           "a node)");
  std::map<int, int> count;
  for (int n : nodes) ++count[n];
  const int me = nodes[static_cast<size_t>(flat->rank())];
  int local = 0;
  for (int r = 0; r < flat->rank(); ++r) local += nodes[static_cast<size_t>(r)] == me;
  const int per_node = count.begin()->second;
  const bool equal = std::all_of(count.begin(), count.end(),
                                 [&](const auto& kv) { return kv.second == per_node; });
  // Note [Two-level worker]: the worker is the only user of every group it runs on, so the flat
  // operations get a private copy of `flat` (whose owner may use it from its own thread).
  CommPtr own = flat->split(0, flat->rank(), flat->name() + ".flat");
  CommPtr intra = flat->split(me, flat->rank(), flat->name() + ".node");
  // Equal nodes: members with the same local index; otherwise the nodes' first members.
  const int color = equal ? local : (local == 0 ? 0 : -1);
  CommPtr cross = flat->split(color, flat->rank(), flat->name() + ".cross");
  return std::make_shared<HierarchicalCommunicator>(
      flat->name() + "(hier)", own, std::move(intra), std::move(cross),
      static_cast<int>(count.size()), equal ? per_node : 0, equal);
}

CommPtr cross_node_group(const CommPtr& comm) {
  auto* h = dynamic_cast<HierarchicalCommunicator*>(comm.get());
  return h ? h->cross() : nullptr;
}

}  // namespace td::distributed
