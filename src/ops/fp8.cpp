#include "tardelli/ops/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/join.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/view.h"

#if TD_WITH_CUDA
#include "ops/cuda/copy.h"
#include "ops/cuda/matmul.h"
#endif

namespace td {

namespace {

DType float8_dtype(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? DType::Float8E4M3FN : DType::Float8E5M2;
}

void check_scale(const char* op, double scale) {
  TD_CHECK(std::isfinite(scale) && scale > 0, op, ": the scale must be finite and > 0, got ",
           scale);
}

}  // namespace

Tensor fp8_quantize(const Tensor& x, Fp8Format format, double scale, bool saturate) {
  TD_CHECK(x.defined(), "fp8_quantize: undefined tensor");
  TD_CHECK(is_floating(x.dtype()), "fp8_quantize: expected a floating tensor, got ", describe(x));
  check_scale("fp8_quantize", scale);
  autograd::NoGradGuard ng;
#if TD_WITH_CUDA
  if (x.is_cuda() && saturate) {  // one pass: scale and round (what the two ops below do)
    Tensor q = Tensor::empty(x.sizes(), float8_dtype(format), x.device());
    cuda_ops::scale_to_fp8_(q, x.detach(), static_cast<float>(scale));
    return q;
  }
#endif
  return to_fp8(mul(x.detach().to(DType::Float32), scale), float8_dtype(format), saturate);
}

Tensor fp8_dequantize(const Tensor& q, double scale, DType dtype) {
  TD_CHECK(q.defined() && is_float8(q.dtype()), "fp8_dequantize: expected a float8 tensor, got ",
           q.defined() ? describe(q) : std::string("an undefined tensor"));
  TD_CHECK(is_floating(dtype), "fp8_dequantize: expected a floating result dtype, got ",
           dtype_name(dtype));
  check_scale("fp8_dequantize", scale);
  autograd::NoGradGuard ng;
  return mul(q.to(DType::Float32), 1.0 / scale).to(dtype);
}

// Note [FP8 emulation].
Tensor fp8_fake_quantize(const Tensor& x, Fp8Format format, double scale, bool saturate) {
  TD_CHECK(x.defined(), "fp8_fake_quantize: undefined tensor");
  TD_CHECK(is_floating(x.dtype()), "fp8_fake_quantize: expected a floating tensor, got ",
           describe(x));
  check_scale("fp8_fake_quantize", scale);
  return fp8_dequantize(fp8_quantize(x, format, scale, saturate), scale);
}

Tensor fp8_scaled_mm(const Tensor& a, double a_scale, const Tensor& b, double b_scale,
                     DType out_dtype, const Tensor& bias) {
  TD_CHECK(a.defined() && b.defined() && is_float8(a.dtype()) && is_float8(b.dtype()),
           "fp8_scaled_mm: expected float8 operands, got ",
           a.defined() ? describe(a) : std::string("undefined"), " and ",
           b.defined() ? describe(b) : std::string("undefined"));
  TD_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "fp8_scaled_mm: operands ",
           describe(a), " and ", describe(b), " are not [m, k] and [n, k]");
  TD_CHECK(a.device() == b.device(), "fp8_scaled_mm: operands on ", a.device(), " and ",
           b.device());
  TD_CHECK(is_floating(out_dtype), "fp8_scaled_mm: expected a floating output dtype, got ",
           dtype_name(out_dtype));
  TD_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == b.size(0) &&
                               is_floating(bias.dtype()) && bias.device() == a.device()),
           "fp8_scaled_mm: bias ", bias.defined() ? describe(bias) : std::string(),
           " is not a floating [", b.size(0), "] vector on ", a.device());
  check_scale("fp8_scaled_mm", a_scale);
  check_scale("fp8_scaled_mm", b_scale);
  autograd::NoGradGuard ng;
#if TD_WITH_CUDA
  if (cuda_ops::fp8_mm_supported(a, b, out_dtype)) {
    // alpha: the product of the two dequantization factors fp8_dequantize applies.
    const double ia = static_cast<float>(1.0 / a_scale), ib = static_cast<float>(1.0 / b_scale);
    const float alpha = static_cast<float>(ia * ib);
    // The epilogue adds a bias of the output's (16-bit) dtype; any other bias is added in fp32.
    const bool fused =
        !bias.defined() || (bias.dtype() == out_dtype && out_dtype != DType::Float32);
    Tensor out =
        Tensor::empty({a.size(0), b.size(0)}, fused ? out_dtype : DType::Float32, a.device());
    cuda_ops::fp8_mm_out(a, b, alpha, fused ? bias : Tensor(), out);
    if (!fused) out = add(out, bias.detach().to(DType::Float32)).to(out_dtype);
    return out;
  }
#endif
  Tensor bf = bias.defined() ? bias.detach().to(DType::Float32) : Tensor();
  return linear(fp8_dequantize(a, a_scale), fp8_dequantize(b, b_scale), bf).to(out_dtype);
}

Tensor amax_tensor(const Tensor& x) {
  TD_CHECK(x.defined(), "amax_tensor: undefined tensor");
  autograd::NoGradGuard ng;
  if (x.numel() == 0) return zeros({}, {DType::Float32, x.device()});
  // |x| and the max are exact in x's own dtype: no fp32 copy (one pass fewer on a GPU); the
  // max is then exact in float32 too.
  return max(abs(x.detach())).to(DType::Float32);
}

double amax(const Tensor& x) {
  return x.defined() ? amax_tensor(x).item<double>() : 0.0;
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

double Fp8Scaling::scale_for(const Tensor& x, const std::function<double(double)>& reduce) const {
  if (history_ != 0) return scale_;
  const double a = amax(x);
  return scale_from(reduce ? reduce(a) : a, scale_);
}

void Fp8Scaling::set_state(double scale, const std::vector<double>& history) {
  TD_CHECK(std::isfinite(scale) && scale > 0,
           "Fp8Scaling.set_state: the scale must be finite "
           "and > 0, got ",
           scale);
  scale_ = scale;
  pending_device_.clear();
  amax_.assign(history.begin(), history.end());
  while (static_cast<int64_t>(amax_.size()) > history_) amax_.pop_front();
  pending_ = -1.0;
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

// Note [Deferred amax].
void Fp8Scaling::observe(double a) {
  pending_ = std::max(pending_, std::isfinite(a) ? a : INFINITY);
}

void Fp8Scaling::observe(const Tensor& a) {
  TD_CHECK(a.defined() && a.dim() == 0 && a.dtype() == DType::Float32,
           "Fp8Scaling.observe: expected a 0-d float32 amax, got ",
           a.defined() ? describe(a) : std::string("an undefined tensor"));
  pending_device_.push_back(a.detach());
}

double Fp8Scaling::pending() const {
  if (!pending_device_.empty()) {
    autograd::NoGradGuard ng;
    // The max of the noted values, exactly (NaN if any is NaN: noted as +inf, as observe(double)).
    const double m = max(stack(pending_device_, 0)).item<double>();
    pending_device_.clear();
    pending_ = std::max(pending_, std::isfinite(m) ? m : INFINITY);
  }
  return pending_;
}

void Fp8Scaling::commit() {
  commit(pending());
}

void Fp8Scaling::commit(double a) {
  pending_device_.clear();  // folded into `a` by whoever reduced pending() over the ranks
  if (a < 0) return;        // nothing noted on any rank
  record(a);
  pending_ = -1.0;
}

const char* fp8_recipe_name(Fp8Recipe r) {
  return r == Fp8Recipe::Hybrid ? "hybrid" : "e4m3";
}

Fp8Recipe parse_fp8_recipe(const std::string& name) {
  if (name == "hybrid") return Fp8Recipe::Hybrid;
  if (name == "e4m3") return Fp8Recipe::E4M3;
  TD_CHECK(false, "fp8 recipe: expected 'hybrid' or 'e4m3', got '", name, "'");
  return Fp8Recipe::Hybrid;
}

Fp8Counts fp8_count(const Tensor& x, Fp8Format format, double scale) {
  Fp8Counts c;
  if (!x.defined() || x.numel() == 0) return c;
  autograd::NoGradGuard ng;
  // |x s| (the fp32 product fp8_quantize rounds) above the largest finite value saturates; at or
  // below half the smallest subnormal it rounds to zero (ties to even: the tie goes to 0). Two
  // counting reductions on x's device (NaN is in neither).
  const double hi = fp8_max(format);
  const double lo = format == Fp8Format::E4M3FN ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
  const Tensor a = abs(mul(x.detach().to(DType::Float32), scale));
  c.values = x.numel();
  c.overflow = sum(gt(a, hi)).item<int64_t>();
  c.underflow = sum(le(a, lo)).item<int64_t>() - sum(eq(a, 0.0)).item<int64_t>();
  return c;
}

namespace {

// Notes x's amax: recorded at once (read back, made the whole tensor's by `whole` when given),
// or observed on x's device for the step's commit (nothing read back: Note [Deferred amax]).
void note_amax(Fp8Scaling& s, Fp8Amax mode, const Tensor& x,
               const std::function<double(double)>& whole) {
  if (mode == Fp8Amax::Record) {
    const double a = amax(x);
    s.record(whole ? whole(a) : a);
  } else if (mode == Fp8Amax::Observe) {
    s.observe(amax_tensor(x));
  }
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Fp8LinearState& state,
                  Fp8Amax amaxes, const Fp8Shards& shards, Fp8Counts* counts) {
  TD_CHECK(x.defined() && weight.defined(), "fp8_linear: undefined input or weight");
  TD_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "fp8_linear: input ",
           describe(x), " does not match weight ", describe(weight), " [out, in]");
  const double sx = state.input.scale_for(x, shards.input);
  const double sw = state.weight.scale_for(weight, shards.weight);
  const int64_t in = x.size(-1), outf = weight.size(0), rows = x.numel() / std::max<int64_t>(in, 1);
  // The operands' FP8 codes: the forward GEMM's, and kept for the backward's (1 byte each).
  Tensor xq = fp8_quantize(reshape(x.detach(), {rows, in}), Fp8Format::E4M3FN, sx);
  Tensor wq = fp8_quantize(weight, Fp8Format::E4M3FN, sw);
  if (counts) {
    counts->add(fp8_count(x, Fp8Format::E4M3FN, sx));
    counts->add(fp8_count(weight, Fp8Format::E4M3FN, sw));
  }
  // A recorded amax is the whole tensor's; a noted one is this shard's, reduced with the
  // others' at the step's commit (Note [Amax reduction]).
  note_amax(state.input, amaxes, x, shards.input);
  note_amax(state.weight, amaxes, weight, shards.weight);
  Shape out_sizes = x.sizes();
  out_sizes.back() = outf;
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = reshape(fp8_scaled_mm(xq, sx, wq, sw, x.dtype(), bias), out_sizes);
  }
  if (autograd::needs_grad({x, weight, bias})) {
    autograd::record("Fp8LinearBackward", {x, weight, bias}, {&out},
                     [xq, wq, sx, sw, rows, in, outf, amaxes, counts, reduce = shards.grad,
                      xs = x.sizes(), xdt = x.dtype(), wdt = weight.dtype(),
                      bdt = bias.defined() ? bias.dtype() : DType::Float32,
                      st = &state](const TensorList& g, const auto& need) {
                       // The output gradient in E5M2 (hybrid) or E4M3 (e4m3), its amax noted for
                       // next time.
                       const Fp8Format gf = st->grad.format();
                       const double sg = st->grad.scale_for(g[0], reduce);
                       Tensor gq = fp8_quantize(reshape(g[0], {rows, outf}), gf, sg);
                       if (counts) counts->add(fp8_count(g[0], gf, sg));
                       note_amax(st->grad, amaxes, g[0], reduce);
                       // dx = dY W and dW = dY^T X as products A B^T of the FP8 codes (transposed
                       // views: Note [FP8 GEMM on cuBLASLt]).
                       Tensor gx, gw, gb;
                       if (need[0])
                         gx = reshape(fp8_scaled_mm(gq, sg, transpose(wq, 0, 1), sw, xdt), xs);
                       if (need[1]) {
                         gw = fp8_scaled_mm(transpose(gq, 0, 1), sg, transpose(xq, 0, 1), sx, wdt);
                       }
                       if (need[2])
                         gb = sum(reshape(g[0].to(DType::Float32), {rows, outf}), {0}).to(bdt);
                       return TensorList{gx, gw, gb};
                     });
  }
  return out;
}

Tensor fp8_observe_grad(const Tensor& y, Fp8Scaling& scaling, Fp8Counts* counts,
                        std::function<double(double)> reduce) {
  if (!autograd::needs_grad({y})) return y;
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = y.detach();  // an alias: the identity
  }
  autograd::record("Fp8ObserveGradBackward", {y}, {&out},
                   [counts, reduce, st = &scaling](const TensorList& g, const auto& /*need*/) {
                     if (counts) {
                       counts->add(fp8_count(g[0], st->format(), st->scale_for(g[0], reduce)));
                     }
                     st->observe(amax_tensor(g[0]));
                     return TensorList{g[0]};
                   });
  return out;
}

}  // namespace td
