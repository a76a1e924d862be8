// CUDA side of adamw_step, the SGD update and the gradient norm: lists of tensors to the
// multi-tensor kernels of kernels/optim (Note [Multi-tensor launches]).
#if TD_WITH_CUDA

#include "ops/cuda/adamw.h"

#include <algorithm>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cuda/launch.h"
#include "optim/adamw.cuh"
#include "tardelli/core/cuda_runtime.h"

namespace td::cuda_ops {
namespace {

// Indices of the list grouped by (device index, param dtype, grad dtype), groups in order of
// first appearance, indices increasing inside a group.
struct Group {
  int device;
  DType p, g;
  std::vector<size_t> items;
};
std::vector<Group> group_by(const TensorList& ps, const TensorList& gs) {
  std::vector<Group> groups;
  for (size_t k = 0; k < ps.size(); ++k) {
    const int dev = ps[k].device().index;
    const DType gd = gs.empty() ? ps[k].dtype() : gs[k].dtype();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& gr) {
      return gr.device == dev && gr.p == ps[k].dtype() && gr.g == gd;
    });
    if (it == groups.end()) {
      groups.push_back({dev, ps[k].dtype(), gd, {}});
      it = groups.end() - 1;
    }
    it->items.push_back(k);
  }
  return groups;
}

// Device memory for `count` descriptors of type C on t's device.
template <typename C>
Tensor descriptor_memory(const Tensor& t, size_t count) {
  return scratch_bytes(t, count * sizeof(C));
}

// Calls f.template operator()<TP, TG>() with the kernel types of (param dtype, grad dtype):
// the grad has the param's dtype or is float32.
template <typename F>
void dispatch_pg(DType p, DType g, const char* op, F&& f) {
  TD_DISPATCH_FLOATING(p, op, [&]<typename P>() {
    using TP = cuda_t<P>;
    if (g == p) {
      f.template operator()<TP, TP>();
    } else {
      TD_CHECK(g == DType::Float32, op, ": grad must have the param's dtype or float32, got ",
               dtype_name(g), " for a ", dtype_name(p), " param");
      if constexpr (!std::is_same_v<TP, float>) f.template operator()<TP, float>();
    }
  });
}

// The chunk descriptors of one group (Note [Multi-tensor launches]).
std::vector<kernels::AdamWChunk> adamw_chunks(const Group& gr, const TensorList& params,
                                              const TensorList& grads, const TensorList& exp_avgs,
                                              const TensorList& exp_avg_sqs) {
  std::vector<kernels::AdamWChunk> chunks;
  for (size_t k : gr.items) {
    const Tensor &p = params[k], &g = grads[k];
    const int64_t n = p.numel();
    char* pp = static_cast<char*>(p.data_ptr());
    const char* gp = static_cast<const char*>(g.data_ptr());
    float* m = exp_avgs[k].data_ptr<float>();
    float* v = exp_avg_sqs[k].data_ptr<float>();
    for (int64_t b = 0; b < n; b += kernels::kOptimChunk) {
      chunks.push_back({pp + b * p.element_size(), gp + b * g.element_size(), m + b, v + b,
                        std::min(kernels::kOptimChunk, n - b)});
    }
  }
  return chunks;
}

// Note [Capturable AdamW]: device copies of descriptor lists, by their contents (the tensors'
// addresses), built on first use with a copy that waits for the device (so the first step of a
// given set of tensors must run eagerly, before a capture) and reused after, with no copy. A
// few lists are kept (an optimizer has a handful of groups); the oldest goes first.
class DescriptorCache {
 public:
  const kernels::AdamWChunk* get(const std::vector<kernels::AdamWChunk>& host, const Tensor& ref) {
    std::lock_guard<std::mutex> lock(mu_);
    const Key key = key_of(host, ref.device().index);
    for (auto& [k, t] : entries_) {
      if (k == key) return static_cast<const kernels::AdamWChunk*>(t.data_ptr());
    }
    Tensor dev = descriptor_memory<kernels::AdamWChunk>(ref, host.size());
    copy_bytes(dev.data_ptr(), ref.device(), host.data(), kCPU,
               host.size() * sizeof(kernels::AdamWChunk));
    if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
    entries_.emplace_back(key, dev);
    return static_cast<const kernels::AdamWChunk*>(dev.data_ptr());
  }

 private:
  using Key = std::vector<uintptr_t>;
  static Key key_of(const std::vector<kernels::AdamWChunk>& host, int device) {
    Key k{static_cast<uintptr_t>(device)};
    for (const auto& c : host) {
      k.insert(k.end(), {reinterpret_cast<uintptr_t>(c.p), reinterpret_cast<uintptr_t>(c.g),
                         reinterpret_cast<uintptr_t>(c.m), reinterpret_cast<uintptr_t>(c.v),
                         static_cast<uintptr_t>(c.n)});
    }
    return k;
  }
  static constexpr size_t kMaxEntries = 64;  // a captured step needs its lists to stay
  std::mutex mu_;
  std::vector<std::pair<Key, Tensor>> entries_;
};

DescriptorCache& descriptor_cache() {
  static auto* c = new DescriptorCache();  // never destroyed: tensors outlive static teardown
  return *c;
}

}  // namespace

void adamw_step_device_coeffs(const TensorList& params, const TensorList& grads,
                              const TensorList& exp_avgs, const TensorList& exp_avg_sqs,
                              const Tensor& coeffs) {
  const char* op = "adamw_step_capturable";
  for (size_t k = 0; k < params.size(); ++k) {
    check_same_cuda_device(op, params[k], {&grads[k], &exp_avgs[k], &exp_avg_sqs[k], &coeffs});
  }
  static_assert(sizeof(kernels::AdamWCoeffs) == 7 * sizeof(float));
  TD_CHECK(coeffs.numel() == 7 && coeffs.dtype() == DType::Float32 && coeffs.is_contiguous(), op,
           ": expected 7 contiguous float32 coefficients, got ", describe(coeffs));
  const auto* dc = static_cast<const kernels::AdamWCoeffs*>(coeffs.data_ptr());
  for (const Group& gr : group_by(params, grads)) {
    const std::vector<kernels::AdamWChunk> chunks =
        adamw_chunks(gr, params, grads, exp_avgs, exp_avg_sqs);
    if (chunks.empty()) continue;
    const Tensor& ref = params[gr.items.front()];
    OnDevice on(ref);
    const kernels::AdamWChunk* dev = descriptor_cache().get(chunks, ref);
    dispatch_pg(gr.p, gr.g, op, [&]<typename TP, typename TG>() {
      kernels::adamw_multi_tensor_device<TP, TG>(dev, static_cast<int64_t>(chunks.size()), dc,
                                                 stream_of(ref));
    });
  }
}

void adamw_step(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                const TensorList& exp_avg_sqs, const AdamWScalars& c) {
  const char* op = "adamw_step";
  for (size_t k = 0; k < params.size(); ++k) {
    check_same_cuda_device(op, params[k], {&grads[k], &exp_avgs[k], &exp_avg_sqs[k]});
  }
  const kernels::AdamWCoeffs kc{c.decay,     c.one_minus_b1, c.b2, c.one_minus_b2,
                                c.step_size, c.bc2_sqrt,     c.eps};
  for (const Group& gr : group_by(params, grads)) {
    const std::vector<kernels::AdamWChunk> chunks =
        adamw_chunks(gr, params, grads, exp_avgs, exp_avg_sqs);
    if (chunks.empty()) continue;
    const Tensor& ref = params[gr.items.front()];
    OnDevice on(ref);
    Tensor dev = descriptor_memory<kernels::AdamWChunk>(ref, chunks.size());
    dispatch_pg(gr.p, gr.g, op, [&]<typename TP, typename TG>() {
      kernels::adamw_multi_tensor<TP, TG>(chunks.data(), static_cast<int64_t>(chunks.size()),
                                          reinterpret_cast<kernels::AdamWChunk*>(dev.data_ptr()),
                                          kc, stream_of(ref));
    });
  }
}

void sgd_step(const TensorList& params, const TensorList& grads, const TensorList& bufs,
              const std::vector<bool>& first, const SGDScalars& c) {
  const char* op = "SGD.step";
  for (size_t k = 0; k < params.size(); ++k) {
    check_same_cuda_device(op, params[k], {&grads[k], &bufs[k]});
  }
  const kernels::SGDCoeffs kc{c.lr, c.weight_decay, c.momentum, c.one_minus_dampening,
                              c.nesterov ? 1 : 0};
  for (const Group& gr : group_by(params, grads)) {
    std::vector<kernels::SGDChunk> chunks;
    for (size_t k : gr.items) {
      const Tensor &p = params[k], &g = grads[k];
      const int64_t n = p.numel();
      char* pp = static_cast<char*>(p.data_ptr());
      const char* gp = static_cast<const char*>(g.data_ptr());
      float* buf = bufs[k].defined() ? bufs[k].data_ptr<float>() : nullptr;
      for (int64_t b = 0; b < n; b += kernels::kOptimChunk) {
        chunks.push_back({pp + b * p.element_size(), gp + b * g.element_size(),
                          buf ? buf + b : nullptr, std::min(kernels::kOptimChunk, n - b),
                          first[k] ? 1 : 0});
      }
    }
    if (chunks.empty()) continue;
    const Tensor& ref = params[gr.items.front()];
    OnDevice on(ref);
    Tensor dev = descriptor_memory<kernels::SGDChunk>(ref, chunks.size());
    dispatch_pg(gr.p, gr.g, op, [&]<typename TP, typename TG>() {
      kernels::sgd_multi_tensor<TP, TG>(chunks.data(), static_cast<int64_t>(chunks.size()),
                                        reinterpret_cast<kernels::SGDChunk*>(dev.data_ptr()), kc,
                                        stream_of(ref));
    });
  }
}

std::vector<double> grad_norm_partials(const TensorList& grads, int kind, double p) {
  const char* op = "clip_grad_norm_";
  // Slots in list order: tensor k's chunks follow tensor k-1's.
  std::vector<int64_t> first_slot(grads.size() + 1, 0);
  for (size_t k = 0; k < grads.size(); ++k) {
    const int64_t n = grads[k].numel();
    first_slot[k + 1] = first_slot[k] + (n + kernels::kOptimChunk - 1) / kernels::kOptimChunk;
  }
  std::vector<double> partials(static_cast<size_t>(first_slot.back()), 0.0);
  for (const Group& gr : group_by(grads, {})) {
    std::vector<kernels::NormChunk> chunks;
    for (size_t k : gr.items) {
      const Tensor& g = grads[k];
      const char* gp = static_cast<const char*>(g.data_ptr());
      const int64_t n = g.numel();
      int64_t slot = first_slot[k];
      for (int64_t b = 0; b < n; b += kernels::kOptimChunk) {
        chunks.push_back(
            {gp + b * g.element_size(), std::min(kernels::kOptimChunk, n - b), slot++});
      }
    }
    if (chunks.empty()) continue;
    const Tensor& ref = grads[gr.items.front()];
    OnDevice on(ref);
    const int64_t total = first_slot.back();
    Tensor dev = descriptor_memory<kernels::NormChunk>(ref, chunks.size());
    Tensor out = scratch_bytes(ref, static_cast<size_t>(total) * sizeof(double));
    TD_DISPATCH_FLOATING(gr.p, op, [&]<typename T>() {
      kernels::grad_norm_partials<cuda_t<T>>(chunks.data(), static_cast<int64_t>(chunks.size()),
                                             reinterpret_cast<kernels::NormChunk*>(dev.data_ptr()),
                                             kind, p, reinterpret_cast<double*>(out.data_ptr()),
                                             stream_of(ref));
    });
    std::vector<double> host(static_cast<size_t>(total));
    copy_bytes(host.data(), kCPU, out.data_ptr(), ref.device(), host.size() * sizeof(double));
    for (const auto& ch : chunks) partials[ch.slot] = host[ch.slot];
  }
  return partials;
}

}  // namespace td::cuda_ops

#endif  // TD_WITH_CUDA
