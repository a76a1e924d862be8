#include "tardelli/models/block_linears.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/matmul.h"

namespace td::models {

namespace {

// t in dtype dt (a differentiable cast; undefined stays undefined).
Tensor as(const Tensor& t, DType dt) {
  return !t.defined() || t.dtype() == dt ? t : to_dtype(t, dt);
}

// ||y - ref|| / ||ref|| over the finite values, in double (0 when ref is all zero).
double relative_error(const Tensor& y, const Tensor& ref) {
  const std::vector<float> a = to_vector<float>(y.to(DType::Float32));
  const std::vector<float> r = to_vector<float>(ref);
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(r[i])) continue;
    const double d = static_cast<double>(a[i]) - r[i];
    num += d * d;
    den += static_cast<double>(r[i]) * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

int64_t nonfinite(const Tensor& y) {
  int64_t n = 0;
  for (float v : to_vector<float>(y.to(DType::Float32))) n += std::isfinite(v) ? 0 : 1;
  return n;
}

}  // namespace

void BlockLinears::set_fp8(int64_t history, double margin, Fp8Recipe recipe) {
  recipe_ = recipe;
  fp8_.clear();
  for (size_t i = 0; i < count_; ++i) fp8_.emplace_back(history, margin, recipe);
}

void BlockLinears::commit_fp8() {
  for (auto& s : fp8_) s.commit();
}

void BlockLinears::set_precisions(std::vector<LinearPrecision> p) {
  TD_CHECK(p.empty() || p.size() == count_, "GPT.set_linear_precisions: ", p.size(),
           " precisions for ", count_, " block linears");
  for (LinearPrecision q : p) {
    TD_CHECK(q != LinearPrecision::FP8 || fp8(),
             "GPT.set_linear_precisions: fp8 for a linear needs FP8 scalings (set_fp8) first");
  }
  precision_ = std::move(p);
}

LinearPrecision BlockLinears::precision(size_t i) const {
  const LinearPrecision p = precision_.empty() ? LinearPrecision::Default : precision_[i];
  return p == LinearPrecision::Default && fp8() ? LinearPrecision::FP8 : p;
}

void BlockLinears::set_monitor(bool on) {
  monitor_ = on;
  reset_stats();
}

void BlockLinears::reset_stats() {
  stats_.assign(monitor_ ? count_ : 0, LinearStats{});
}

// Note [Linear precision]; the statistics of Note [Adaptive precision].
LinearFn BlockLinears::gemm(size_t i, const Tensor& w, const Tensor& b, Fp8Amax amaxes,
                            const Fp8Shards& shards) {
  const LinearPrecision p = precision(i);
  const bool observe = amaxes != Fp8Amax::Ignore;
  LinearStats* st = monitor_ && observe ? &stats_[i] : nullptr;
  if (p == LinearPrecision::Default && st == nullptr) return {};
  Fp8LinearState* f8 = fp8_.empty() ? nullptr : &fp8_[i];
  // Delayed scaling before its first commit quantizes with the initial scale 1: its FP8
  // statistics would judge that scale, not the format, so they are not gathered yet.
  const bool fp8_stats =
      st && f8 && (f8->input.history_length() == 0 || !f8->input.history().empty());
  return [p, w, b, amaxes, shards, f8, st, fp8_stats](const Tensor& x, const Tensor& wc,
                                                      const Tensor& bc) -> Tensor {
    Tensor y;
    switch (p) {
      case LinearPrecision::FP8:
        y = fp8_linear(x, wc, bc, *f8, amaxes, shards, fp8_stats ? &st->fp8 : nullptr);
        break;
      case LinearPrecision::BF16: {
        const DType bf = DType::BFloat16;
        y = as(linear(as(x, bf), as(wc, bf), as(bc, bf)), x.dtype());
        break;
      }
      case LinearPrecision::FP32:
        y = as(linear(as(x, DType::Float32), w, bc.defined() ? b : Tensor()), x.dtype());
        break;
      default:
        y = linear(x, wc, bc);
    }
    if (f8 && p != LinearPrecision::FP8 && st) {
      // The shadow FP8 state: the scalings keep recording (so a demotion finds current scales)
      // and the counts say how FP8 would have done.
      if (fp8_stats) {
        st->fp8.add(fp8_count(x, Fp8Format::E4M3FN, f8->input.scale_for(x, shards.input)));
        st->fp8.add(fp8_count(wc, Fp8Format::E4M3FN, f8->weight.scale_for(wc, shards.weight)));
      }
      f8->input.observe(amax_tensor(x));
      f8->weight.observe(amax_tensor(wc));
      y = fp8_observe_grad(y, f8->grad, fp8_stats ? &st->fp8 : nullptr, shards.grad);
    }
    if (st) {
      autograd::NoGradGuard ng;
      const Tensor bm = bc.defined() ? b.detach() : Tensor();
      const Tensor ref = linear(x.detach().to(DType::Float32), w.detach(), bm);
      if (fp8_stats) {
        Tensor y8 = y;
        if (p != LinearPrecision::FP8) {
          // The FP8 GEMM this linear would run, with the same scales (current scaling
          // measures the same tensors).
          const double sx = f8->input.scale_for(x, shards.input);
          const double sw = f8->weight.scale_for(wc, shards.weight);
          y8 = linear(fp8_fake_quantize(x, Fp8Format::E4M3FN, sx),
                      fp8_fake_quantize(wc, Fp8Format::E4M3FN, sw),
                      bc.defined() ? bc.detach().to(DType::Float32) : Tensor());
        }
        st->fp8_error = std::max(st->fp8_error, relative_error(y8, ref));
      }
      if (p == LinearPrecision::BF16 || p == LinearPrecision::FP32) {
        const DType bf = DType::BFloat16;
        const Tensor y16 = p == LinearPrecision::BF16
                               ? y
                               : linear(as(x.detach(), bf), as(wc.detach(), bf),
                                        bc.defined() ? as(bc.detach(), bf) : Tensor());
        st->bf16_error = std::max(st->bf16_error, relative_error(y16, ref));
      }
      st->nonfinite += nonfinite(y);
    }
    return y;
  };
}

}  // namespace td::models
