#include "tardelli/ops/dropout.h"

#include <algorithm>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/autograd/function.h"
#include "tardelli/ops/factory.h"
#if TD_WITH_CUDA
#include "ops/cuda/dropout.h"
#endif

// Note [Dropout mask]: the mask is a pure function of (PhiloxState, logical element index):
// element i keeps iff uniform(philox(block offset + i/4, subsequence; seed)[i % 4]) >= p, the
// rule of core/rng.h. The CPU kernel walks whole Philox blocks, so a thread's range never
// depends on how many threads there are and the mask is identical for any thread count (and
// to the CUDA kernel's). The threshold is compared in fp32 (float(p)), as the CUDA kernel does.
// The backward re-runs the kernel on the gradient with the saved state instead of storing a
// mask: one bit per element is not kept alive between forward and backward.

namespace td {

using autograd::needs_grad;
using autograd::record;

namespace {

constexpr int64_t kBlockGrain = 4096;  // Philox blocks (of 4 elements) per thread at least

inline std::array<uint32_t, 4> philox_block(const PhiloxState& st, uint64_t b) {
  uint64_t ctr = st.offset + b;
  return philox4x32(
      {static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32),
       static_cast<uint32_t>(st.subsequence), static_cast<uint32_t>(st.subsequence >> 32)},
      {static_cast<uint32_t>(st.seed), static_cast<uint32_t>(st.seed >> 32)});
}

void check_p(double p, const char* op) {
  TD_CHECK(p >= 0.0 && p <= 1.0, op, ": dropout probability has to be between 0 and 1, got ", p);
}

}  // namespace

Tensor dropout_apply(const Tensor& x, double p, const PhiloxState& st) {
  ops::check_defined(x, "dropout", "input");
  ops::check_floating(x, "dropout");
  check_p(p, "dropout");
  const float pf = static_cast<float>(p);
  // p == 1 keeps nothing (uniform < 1 always); the scale is never applied then.
  const float scale = p < 1.0 ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
#if TD_WITH_CUDA
  if (x.is_cuda()) return cuda_ops::dropout_apply(x, pf, scale, st);
#endif
  ops::check_cpu(x, "dropout");
  Tensor in = x.detach().contiguous();  // logical row-major order = memory order
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  const int64_t n = x.numel();
  if (n == 0) return out;
  TD_DISPATCH_FLOATING(x.dtype(), "dropout", [&]<typename T>() {
    const T* src = static_cast<const T*>(in.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());
    int64_t nblocks = (n + 3) / 4;
    cpu::parallel_for(nblocks, kBlockGrain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        auto r = philox_block(st, static_cast<uint64_t>(b));
        int64_t base = b * 4;
        int lanes = static_cast<int>(std::min<int64_t>(4, n - base));
        for (int l = 0; l < lanes; ++l) {
          bool keep = uint_to_uniform(r[l]) >= pf;
          float v = static_cast<float>(src[base + l]);
          dst[base + l] = static_cast<T>(keep ? v * scale : 0.0f);
        }
      }
    });
  });
  return out;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  ops::check_defined(x, "dropout", "input");
  check_p(p, "dropout");
  if (!training || p == 0.0) return x;
#if TD_WITH_CUDA
  if (!x.is_cuda()) ops::check_cpu(x, "dropout");
#else
  ops::check_cpu(x, "dropout");
#endif
  ops::check_floating(x, "dropout");
  if (p == 1.0) {
    Tensor out = zeros(x.sizes(), {x.dtype(), x.device()});
    if (needs_grad({x})) {
      record("DropoutBackward", {x}, {&out},
             [](const TensorList& g, const auto&) { return TensorList{zeros_like(g[0])}; });
    }
    return out;
  }
  Generator& g = gen ? *gen : default_generator();
  PhiloxState st = g.reserve(x.numel());
  Tensor out = dropout_apply(x, p, st);
  if (needs_grad({x})) {
    record("DropoutBackward", {x}, {&out}, [p, st](const TensorList& gr, const auto&) {
      return TensorList{dropout_apply(gr[0], p, st)};
    });
  }
  return out;
}

}  // namespace td
