#include "tardelli/distributed/host_staged.h"

#include <unistd.h>

#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {

namespace {

// Note [Host staging]: the copy back into the device tensors runs once, when the host
// operation has completed (in wait()).
class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr host, std::function<void()> finish)
      : host_(std::move(host)), finish_(std::move(finish)) {}
  void wait() override {
    if (host_) host_->wait();
    std::call_once(done_, [this] {
      if (finish_) finish_();
    });
  }
  bool is_completed() override { return !host_ || host_->is_completed(); }

 private:
  WorkPtr host_;
  std::function<void()> finish_;
  std::once_flag done_;
};

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(CommPtr host, bool stage_host_tensors)
      : Communicator(host->rank(), host->size(), host->name(), host->options()),
        host_(std::move(host)),
        stage_host_(stage_host_tensors) {}

  const char* backend() const override { return "mpi-staged"; }

 protected:
  WorkPtr do_all_reduce(Tensor& t, ReduceOp op, bool async_op) override {
    Tensor h = to_host(t);
    return finish(host_->all_reduce(h, op, async_op), async_op, {{t, h}});
  }
  WorkPtr do_all_gather(Tensor& out, const Tensor& in, bool async_op) override {
    Tensor ho = host_buffer(out), hi = to_host(in);
    return finish(host_->all_gather(ho, hi, async_op), async_op, {{out, ho}}, {hi});
  }
  WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op, bool async_op) override {
    Tensor ho = host_buffer(out), hi = to_host(in);
    return finish(host_->reduce_scatter(ho, hi, op, async_op), async_op, {{out, ho}}, {hi});
  }
  WorkPtr do_broadcast(Tensor& t, int root, bool async_op) override {
    Tensor h = to_host(t);
    // Only the receivers' tensors change.
    std::vector<std::pair<Tensor, Tensor>> back;
    if (rank() != root) back.emplace_back(t, h);
    return finish(host_->broadcast(h, root, async_op), async_op, std::move(back), {h});
  }
  WorkPtr do_send(const Tensor& t, int dst, int tag, bool async_op) override {
    Tensor h = to_host(t);
    return finish(host_->send(h, dst, tag, async_op), async_op, {}, {h});
  }
  WorkPtr do_recv(Tensor& t, int src, int tag, bool async_op) override {
    Tensor h = host_buffer(t);
    return finish(host_->recv(h, src, tag, async_op), async_op, {{t, h}});
  }
  WorkPtr do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                        const std::vector<int64_t>& in_splits, bool async_op) override {
    Tensor ho = host_buffer(out), hi = to_host(in);
    return finish(host_->all_to_all(ho, hi, out_splits, in_splits, async_op), async_op, {{out, ho}},
                  {hi});
  }
  void do_barrier() override { host_->barrier(); }
  CommPtr do_split(int color, int key, const std::string& name) override {
    CommPtr sub = host_->split(color, key, name);
    if (!sub) return nullptr;
    return std::make_shared<HostStagedCommunicator>(std::move(sub), stage_host_);
  }
  // The host communicator checks its own calls (same dtypes and counts).
  void check_consistency(const char*, DType, int64_t, int64_t) override {}

 private:
  bool staged(const Tensor& t) const { return t.is_cuda() || stage_host_; }

  // The host copy of an input (a distinct buffer when staged; else the tensor itself).
  Tensor to_host(const Tensor& t) const {
    if (!staged(t)) return t;
    autograd::NoGradGuard ng;
    return t.is_cuda() ? t.to(kCPU) : t.clone();
  }
  // A host buffer for an output (its contents are overwritten by the operation).
  Tensor host_buffer(const Tensor& t) const {
    if (!staged(t)) return t;
    return Tensor::empty(t.sizes(), t.dtype(), kCPU);
  }

  // Copies each (device, host) pair back once the host operation is done: now when blocking,
  // in wait() when async. `keep` holds host inputs alive until then.
  WorkPtr finish(WorkPtr host_work, bool async_op, std::vector<std::pair<Tensor, Tensor>> back,
                 std::vector<Tensor> keep = {}) {
    auto copy_back = [back = std::move(back), keep = std::move(keep)]() mutable {
      autograd::NoGradGuard ng;
      for (auto& [dst, src] : back) {
        if (!dst.shares_storage(src)) dst.copy_(src);
      }
    };
    if (!async_op) {
      copy_back();
      return nullptr;
    }
    return std::make_shared<StagedWork>(std::move(host_work), std::move(copy_back));
  }

  CommPtr host_;
  bool stage_host_;
};

}  // namespace

std::optional<std::pair<int, int>> ranks_sharing_a_device(const CommPtr& world, int device) {
  TD_CHECK(world != nullptr, "ranks_sharing_a_device: the communicator is null");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const auto host_hash = static_cast<int64_t>(std::hash<std::string>{}(host));
  Tensor mine = from_vector(std::vector<int64_t>{host_hash, device}, {2});
  Tensor all = empty({2 * world->size()}, {DType::Int64});
  world->all_gather(all, mine);
  const std::vector<int64_t> v = to_vector<int64_t>(all);
  for (int a = 0; a < world->size(); ++a) {
    for (int b = a + 1; b < world->size(); ++b) {
      if (v[2 * a] == v[2 * b] && v[2 * a + 1] == v[2 * b + 1]) return std::pair{a, b};
    }
  }
  return std::nullopt;
}

CommPtr host_staged(const CommPtr& host, bool stage_host_tensors) {
  TD_CHECK(host != nullptr, "host_staged: the host communicator is null");
  TD_CHECK(std::string(host->backend()) == "mpi",
           "host_staged: needs a host (MPI) communicator, got a '", host->backend(), "' one (",
           host->where(), ")");
  return std::make_shared<HostStagedCommunicator>(host, stage_host_tensors);
}

}  // namespace td::distributed
