#include "tardelli/optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/loops.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/elementwise.h"
#if TD_WITH_CUDA
#include "ops/cuda/adamw.h"
#endif

namespace td::optim {

namespace {

enum class Kind { One, Two, Inf, General };

// Note [Deterministic grad norm]: each gradient is cut into fixed 16384-element chunks, each
// chunk is reduced in double on whatever thread runs it, and the partial results are combined
// in chunk order, so the norm does not depend on the thread count.
double total_norm(const TensorList& params, double p, const char* who) {
  TD_CHECK(p > 0, who, ": norm_type must be > 0 (or inf), got ", p);
  const Kind kind = std::isinf(p) ? Kind::Inf
                    : p == 1      ? Kind::One
                    : p == 2      ? Kind::Two
                                  : Kind::General;
  TensorList grads, cuda_grads;
  std::vector<const TensorImpl*> seen;  // a tensor listed twice (tied weights) counts once
  for (const auto& t : params) {
    TD_CHECK(t.defined(), who, ": a parameter is an undefined tensor");
    if (std::find(seen.begin(), seen.end(), t.impl()) != seen.end()) continue;
    seen.push_back(t.impl());
    Tensor g = t.grad();
    if (!g.defined()) continue;
    TD_CHECK(g.is_cpu() || g.is_cuda(), who, ": gradient on ", g.device().str(),
             "; this build has only a CPU implementation");
    TD_CHECK(g.is_floating_point(), who, ": gradients must be floating point, got ", describe(g));
    (g.is_cuda() ? cuda_grads : grads).push_back(g.is_contiguous() ? g : g.contiguous());
  }
  struct Chunk {
    size_t k;
    int64_t b, e;
  };
  constexpr int64_t kChunk = 16384;
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < grads.size(); ++k) {
    const int64_t n = grads[k].numel();
    for (int64_t b = 0; b < n; b += kChunk) chunks.push_back({k, b, std::min(n, b + kChunk)});
  }
  std::vector<double> partial(chunks.size(), 0.0);
  cpu::parallel_for(static_cast<int64_t>(chunks.size()), 2, [&](int64_t b, int64_t e) {
    for (int64_t ci = b; ci < e; ++ci) {
      const Chunk& ch = chunks[ci];
      const Tensor& g = grads[ch.k];
      double acc = 0;
      TD_DISPATCH_FLOATING(g.dtype(), "clip_grad_norm_", [&]<typename T>() {
        const T* x = static_cast<const T*>(g.data_ptr());
        for (int64_t i = ch.b; i < ch.e; ++i) {
          const double a = std::fabs(static_cast<double>(static_cast<float>(x[i])));
          switch (kind) {
            case Kind::One:
              acc += a;
              break;
            case Kind::Two:
              acc += a * a;
              break;
            case Kind::Inf:
              acc = std::isnan(a) || std::isnan(acc) ? NAN : std::max(acc, a);
              break;
            case Kind::General:
              acc += std::pow(a, p);
              break;
          }
        }
      });
      partial[ci] = acc;
    }
  });
  // CUDA gradients: one partial per device chunk, reduced in a fixed order on the device and
  // appended after the CPU partials, so the total is still deterministic.
#if TD_WITH_CUDA
  if (!cuda_grads.empty()) {
    const int code = kind == Kind::Inf ? 0 : kind == Kind::One ? 1 : kind == Kind::Two ? 2 : 3;
    std::vector<double> dev = cuda_ops::grad_norm_partials(cuda_grads, code, p);
    partial.insert(partial.end(), dev.begin(), dev.end());
  }
#else
  TD_CHECK(cuda_grads.empty(), who, ": CUDA gradients in a build without the CUDA backend");
#endif
  double acc = 0;
  for (double x : partial) {
    acc = kind == Kind::Inf ? (std::isnan(x) || std::isnan(acc) ? NAN : std::max(acc, x)) : acc + x;
  }
  switch (kind) {
    case Kind::One:
    case Kind::Inf:
      return acc;
    case Kind::Two:
      return std::sqrt(acc);
    case Kind::General:
      return std::pow(acc, 1.0 / p);
  }
  return acc;
}

}  // namespace

double grad_norm(const TensorList& params, double norm_type) {
  return total_norm(params, norm_type, "grad_norm");
}

double clip_grad_norm_(const TensorList& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  TD_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  const double total = total_norm(params, norm_type, "clip_grad_norm_");
  if (!std::isfinite(total)) {
    TD_CHECK(!error_if_nonfinite, "clip_grad_norm_: the total norm of order ", norm_type,
             " of the gradients is non-finite (", total,
             "), so it cannot be clipped (error_if_nonfinite=true)");
    return total;
  }
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    autograd::NoGradGuard ng;
    std::vector<const TensorImpl*> done;
    for (const auto& t : params) {
      if (std::find(done.begin(), done.end(), t.impl()) != done.end()) continue;
      done.push_back(t.impl());
      Tensor g = t.grad();
      if (g.defined()) mul_(g, coef);
    }
  }
  return total;
}

}  // namespace td::optim
