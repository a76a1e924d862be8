#include "tardelli/parallel/expert_parallel.h"

#include <vector>

#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"

namespace td::parallel {

// Note [Expert-parallel dispatch].
models::MoEExpertDispatch expert_parallel_dispatch(distributed::CommPtr ep) {
  TD_CHECK(ep != nullptr, "expert_parallel_dispatch: the expert-parallel communicator is null");
  return [ep](const Tensor& rows, const std::vector<int64_t>& per_expert,
              const models::MoELocalExperts& local) -> Tensor {
    const int64_t n = ep->size(), r = ep->rank();
    const int64_t E = static_cast<int64_t>(per_expert.size());
    TD_CHECK(E > 0 && E % n == 0, "expert parallelism: ", E,
             " experts do not split evenly over ep ", n, " (rank ", r, ")");
    if (n == 1) return local(rows, per_expert);
    const int64_t El = E / n;
    const auto all = distributed::exchange_counts(per_expert, ep);  // all[j][e]
    std::vector<int64_t> send(static_cast<size_t>(n), 0), recv(static_cast<size_t>(n), 0);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t l = 0; l < El; ++l) {
        send[j] += per_expert[static_cast<size_t>(j * El + l)];
        recv[j] += all[j][static_cast<size_t>(r * El + l)];
      }
    }
    const Tensor got = distributed::all_to_all_rows(rows, send, recv, ep);
    // got: source-major, local-expert order inside each source. Regroup local-expert-major.
    // at[j]: source j's next row in got (its block starts after the blocks of sources < j, and
    // within it local expert l's rows follow expert l-1's).
    std::vector<int64_t> at(static_cast<size_t>(n), 0);
    for (int64_t j = 1; j < n; ++j) at[j] = at[j - 1] + recv[j - 1];
    std::vector<int64_t> order, sizes(static_cast<size_t>(El), 0);
    order.reserve(static_cast<size_t>(got.size(0)));
    for (int64_t l = 0; l < El; ++l) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t count = all[j][static_cast<size_t>(r * El + l)];
        for (int64_t i = 0; i < count; ++i) order.push_back(at[j]++);
        sizes[l] += count;
      }
    }
    std::vector<int64_t> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i)
      inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
    const int64_t R = static_cast<int64_t>(order.size());
    const Tensor grouped = index_select(got, 0, from_vector<int64_t>(order, {R}).to(got.device()));
    const Tensor out = local(grouped, sizes);
    const Tensor back = index_select(out, 0, from_vector<int64_t>(inverse, {R}).to(out.device()));
    return distributed::all_to_all_rows(back, recv, send, ep);
  };
}

void apply_expert_parallel(models::GPT& model, const distributed::CommPtr& ep) {
  TD_CHECK(ep != nullptr, "apply_expert_parallel: the expert-parallel communicator is null");
  model.set_expert_parallel(ep->rank(), ep->size(), expert_parallel_dispatch(ep));
}

}  // namespace td::parallel
