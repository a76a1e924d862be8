#include "tardelli/optim/sgd.h"

#include <map>

#include "ops/cpu/loops.h"
#include "tardelli/ops/copy.h"
#if TD_WITH_CUDA
#include "ops/cuda/adamw.h"
#endif

namespace td::optim {

namespace {

std::map<std::string, double> sgd_defaults(const SGDOptions& o) {
  return {{"momentum", o.momentum}, {"dampening", o.dampening}, {"nesterov", o.nesterov ? 1 : 0}};
}

struct Coeffs {
  float lr, weight_decay, momentum, one_minus_dampening;
  bool nesterov;
};

// Elements [b, e) of one parameter; `first`: the momentum buffer is initialized from d.
template <typename TP, typename TG>
void sgd_range(TP* __restrict__ p, const TG* __restrict__ g, float* __restrict__ buf, int64_t b,
               int64_t e, const Coeffs& c, bool first) {
  for (int64_t i = b; i < e; ++i) {
    const float pi = static_cast<float>(p[i]);
    float d = static_cast<float>(g[i]);
    if (c.weight_decay != 0.0f) d = d + c.weight_decay * pi;
    if (buf) {
      const float bi = first ? d : c.momentum * buf[i] + c.one_minus_dampening * d;
      buf[i] = bi;
      d = c.nesterov ? d + c.momentum * bi : bi;
    }
    p[i] = static_cast<TP>(pi - c.lr * d);
  }
}

}  // namespace

SGD::SGD(TensorList params, const SGDOptions& defaults)
    : SGD(std::vector<ParamGroup>{ParamGroup(std::move(params))}, defaults) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults)
    : Optimizer("SGD", defaults.lr, defaults.weight_decay, sgd_defaults(defaults)) {
  init(std::move(groups));
}

void SGD::check_group(const ParamGroup& g) const {
  const double momentum = g.option("momentum"), dampening = g.option("dampening");
  const double nesterov = g.option("nesterov");
  TD_CHECK(*g.lr >= 0, "SGD: invalid learning rate ", *g.lr);
  TD_CHECK(momentum >= 0, "SGD: invalid momentum value ", momentum);
  TD_CHECK(*g.weight_decay >= 0, "SGD: invalid weight_decay value ", *g.weight_decay);
  TD_CHECK(nesterov == 0 || nesterov == 1, "SGD: nesterov must be 0 or 1, got ", nesterov);
  TD_CHECK(nesterov == 0 || (momentum > 0 && dampening == 0),
           "SGD: Nesterov momentum requires a momentum and zero dampening (momentum ", momentum,
           ", dampening ", dampening, ")");
}

void SGD::update_group(const ParamGroup& group, ParamStates& state) {
  Coeffs c;
  c.lr = static_cast<float>(*group.lr);
  c.weight_decay = static_cast<float>(*group.weight_decay);
  c.momentum = static_cast<float>(group.option("momentum"));
  c.one_minus_dampening = static_cast<float>(1.0 - group.option("dampening"));
  c.nesterov = group.option("nesterov") != 0;
  const bool use_momentum = group.option("momentum") != 0;

  struct Item {
    Tensor param, work, grad, buf;
    bool first;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    TD_CHECK(g.sizes() == p.sizes(), "SGD.step: gradient ", describe(g),
             " does not match parameter ", describe(p));
    if (g.dtype() != p.dtype() && g.dtype() != DType::Float32) g = g.to(DType::Float32);
    if (!g.is_contiguous()) g = g.contiguous();
    auto& st = state[i];
    st.step += 1;
    Item it{p, p.is_contiguous() ? p : p.contiguous(), g, Tensor(), false};
    if (use_momentum) {
      auto found = st.tensors.find("momentum_buffer");
      it.first = found == st.tensors.end();
      if (it.first) {
        st.tensors["momentum_buffer"] = Tensor::empty(p.sizes(), DType::Float32, p.device());
      }
      it.buf = st.tensors.at("momentum_buffer");
    }
    items.push_back(std::move(it));
  }
  // CUDA parameters: one multi-tensor launch per device and dtype pair; the rest below.
#if TD_WITH_CUDA
  {
    TensorList ps, gs, bs;
    std::vector<bool> firsts;
    std::vector<Item> cpu_items;
    for (auto& it : items) {
      if (it.work.is_cuda()) {
        ps.push_back(it.work);
        gs.push_back(it.grad);
        bs.push_back(it.buf);
        firsts.push_back(it.first);
      } else {
        cpu_items.push_back(it);
      }
    }
    if (!ps.empty()) {
      cuda_ops::sgd_step(ps, gs, bs, firsts,
                         {c.lr, c.weight_decay, c.momentum, c.one_minus_dampening, c.nesterov});
      for (auto& it : items) {
        if (it.work.is_cuda() && !it.work.is_same(it.param)) copy_into(it.param, it.work);
      }
      items = std::move(cpu_items);
    }
  }
#endif
  // One parallel region over fixed-size chunks of all parameters (as td::adamw_step does).
  struct Chunk {
    size_t k;
    int64_t b, e;
  };
  constexpr int64_t kChunk = 16384;
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const int64_t n = items[k].param.numel();
    total += n;
    for (int64_t b = 0; b < n; b += kChunk) chunks.push_back({k, b, std::min(n, b + kChunk)});
  }
  int64_t grain = std::max<int64_t>(1, cpu::kGrain / kChunk);
  if (total < cpu::kGrain) grain = static_cast<int64_t>(chunks.size());
  cpu::parallel_for(static_cast<int64_t>(chunks.size()), grain, [&](int64_t b, int64_t e) {
    for (int64_t ci = b; ci < e; ++ci) {
      const Chunk& ch = chunks[ci];
      const Item& it = items[ch.k];
      float* buf = it.buf.defined() ? it.buf.data_ptr<float>() : nullptr;
      TD_DISPATCH_FLOATING(it.work.dtype(), "SGD.step", [&]<typename TP>() {
        TP* pp = static_cast<TP*>(it.work.data_ptr());
        if (it.grad.dtype() == it.work.dtype()) {
          sgd_range<TP, TP>(pp, static_cast<const TP*>(it.grad.data_ptr()), buf, ch.b, ch.e, c,
                            it.first);
        } else {
          sgd_range<TP, float>(pp, it.grad.data_ptr<float>(), buf, ch.b, ch.e, c, it.first);
        }
      });
    }
  });
  for (auto& it : items) {
    if (!it.work.is_same(it.param)) copy_into(it.param, it.work);
  }
}

}  // namespace td::optim
