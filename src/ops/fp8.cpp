#include "tardelli/ops/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/view.h"

namespace td {

// Note [FP8 emulation].
Tensor fp8_fake_quantize(const Tensor& x, Fp8Format format, double scale, bool saturate) {
  TD_CHECK(x.defined(), "fp8_fake_quantize: undefined tensor");
  TD_CHECK(is_floating(x.dtype()), "fp8_fake_quantize: expected a floating tensor, got ",
           describe(x));
  TD_CHECK(std::isfinite(scale) && scale > 0,
           "fp8_fake_quantize: the scale must be finite and > 0,"
           " got ",
           scale);
  autograd::NoGradGuard ng;
  std::vector<float> v = to_vector<float>(x);
  const float s = static_cast<float>(scale), inv = static_cast<float>(1.0 / scale);
  for (float& a : v) a *= s;
  std::vector<uint8_t> q(v.size());
  fp8_from_float(v.data(), q.data(), v.size(), format, saturate);
  fp8_to_float(q.data(), v.data(), v.size(), format);
  for (float& a : v) a *= inv;  // the dequantized value in fp32, as an FP8 GEMM's scale_inv
  return from_vector<float>(v, x.sizes()).to(x.device());
}

double amax(const Tensor& x) {
  if (!x.defined() || x.numel() == 0) return 0.0;
  autograd::NoGradGuard ng;
  return max(abs(x.to(DType::Float32))).item<double>();
}

// Note [FP8 scaling].
Fp8Scaling::Fp8Scaling(Fp8Format format, int64_t history, double margin)
    : format_(format), history_(history), margin_(margin) {
  TD_CHECK(history >= 0,
           "Fp8Scaling: the amax history must be >= 0 steps (0: current scaling),"
           " got ",
           history);
  TD_CHECK(std::isfinite(margin) && margin >= 0, "Fp8Scaling: the margin must be >= 0, got ",
           margin);
}

double Fp8Scaling::scale_from(double a, double previous) const {
  if (!(a > 0) || !std::isfinite(a)) return previous;
  return static_cast<double>(fp8_max(format_)) / a / std::exp2(margin_);
}

double Fp8Scaling::scale_for(const Tensor& x) const {
  return history_ == 0 ? scale_from(amax(x), scale_) : scale_;
}

void Fp8Scaling::set_state(double scale, const std::vector<double>& history) {
  TD_CHECK(std::isfinite(scale) && scale > 0,
           "Fp8Scaling.set_state: the scale must be finite "
           "and > 0, got ",
           scale);
  scale_ = scale;
  amax_.assign(history.begin(), history.end());
  while (static_cast<int64_t>(amax_.size()) > history_) amax_.pop_front();
}

void Fp8Scaling::record(double a) {
  if (history_ == 0) {
    scale_ = scale_from(a, scale_);
    return;
  }
  amax_.push_back(a);
  while (static_cast<int64_t>(amax_.size()) > history_) amax_.pop_front();
  double m = 0.0;
  for (double h : amax_) {
    if (std::isfinite(h)) m = std::max(m, h);
  }
  scale_ = scale_from(m, scale_);
}

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Fp8LinearState& state,
                  bool record) {
  TD_CHECK(x.defined() && weight.defined(), "fp8_linear: undefined input or weight");
  TD_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "fp8_linear: input ",
           describe(x), " does not match weight ", describe(weight), " [out, in]");
  const double sx = state.input.scale_for(x), sw = state.weight.scale_for(weight);
  Tensor xq = fp8_fake_quantize(x, Fp8Format::E4M3FN, sx);
  Tensor wq = fp8_fake_quantize(weight, Fp8Format::E4M3FN, sw);
  if (record) {
    state.input.record(amax(x));
    state.weight.record(amax(weight));
  }
  Tensor out;
  {
    autograd::NoGradGuard ng;
    Tensor b = bias.defined() ? bias.detach().to(DType::Float32) : Tensor();
    out = linear(xq, wq, b).to(x.dtype());
  }
  if (autograd::needs_grad({x, weight, bias})) {
    const int64_t rows = x.numel() / x.size(-1);
    autograd::record(
        "Fp8LinearBackward", {x, weight, bias}, {&out},
        [xq, wq, rows, record, xs = x.sizes(), xdt = x.dtype(), wdt = weight.dtype(),
         bdt = bias.defined() ? bias.dtype() : DType::Float32,
         st = &state](const TensorList& g, const auto& need) {
          const int64_t in = wq.size(1), outf = wq.size(0);
          // The output gradient in E5M2 (the hybrid recipe), its amax recorded for next time.
          const double sg = st->grad.scale_for(g[0]);
          Tensor gq = reshape(fp8_fake_quantize(g[0], Fp8Format::E5M2, sg), {rows, outf});
          if (record) st->grad.record(amax(g[0]));
          Tensor gx, gw, gb;
          if (need[0]) gx = reshape(mm(gq, wq), xs).to(xdt);
          if (need[1]) gw = mm(transpose(gq, 0, 1), reshape(xq, {rows, in})).to(wdt);
          if (need[2]) gb = sum(reshape(g[0].to(DType::Float32), {rows, outf}), {0}).to(bdt);
          return TensorList{gx, gw, gb};
        });
  }
  return out;
}

}  // namespace td
