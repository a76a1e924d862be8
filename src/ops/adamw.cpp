#include "tardelli/ops/adamw.h"

#include <cmath>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/join.h"
#if TD_WITH_CUDA
#include "ops/cuda/adamw.h"
#endif

// Note [AdamW order of operations]: torch.optim.AdamW (single-tensor and foreach paths) does
//   p *= 1 - lr * wd
//   m = lerp(m, g, 1 - b1);  v = b2 v + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// i.e. the decay uses the parameter before the Adam step. We follow it exactly (the scalar
// factors are formed in double, then each element is updated in fp32) so that a run can be
// compared to torch step by step. bf16/f16 parameters are read, updated in fp32 and rounded
// once per step.

namespace td {

namespace {

struct Coeffs {
  float decay, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps;
};

Coeffs make_coeffs(const AdamWConfig& cfg) {
  TD_CHECK(cfg.step >= 1, "adamw_step: step must be >= 1 (1-based), got ", cfg.step);
  TD_CHECK(cfg.lr >= 0, "adamw_step: lr must be >= 0, got ", cfg.lr);
  TD_CHECK(cfg.beta1 >= 0 && cfg.beta1 < 1, "adamw_step: beta1 must be in [0, 1), got ", cfg.beta1);
  TD_CHECK(cfg.beta2 >= 0 && cfg.beta2 < 1, "adamw_step: beta2 must be in [0, 1), got ", cfg.beta2);
  TD_CHECK(cfg.eps >= 0, "adamw_step: eps must be >= 0, got ", cfg.eps);
  TD_CHECK(cfg.weight_decay >= 0, "adamw_step: weight_decay must be >= 0, got ", cfg.weight_decay);
  const double t = static_cast<double>(cfg.step);
  const double bc1 = 1.0 - std::pow(cfg.beta1, t), bc2 = 1.0 - std::pow(cfg.beta2, t);
  Coeffs c;
  c.decay = static_cast<float>(1.0 - cfg.lr * cfg.weight_decay);
  c.one_minus_b1 = static_cast<float>(1.0 - cfg.beta1);
  c.b2 = static_cast<float>(cfg.beta2);
  c.one_minus_b2 = static_cast<float>(1.0 - cfg.beta2);
  c.step_size = static_cast<float>(cfg.lr / bc1);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(cfg.eps);
  return c;
}

void check_group(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                 const std::string& where) {
  const char* op = "adamw_step";
  TD_CHECK(p.defined() && g.defined() && m.defined() && v.defined(), op, where,
           ": param, grad, exp_avg and exp_avg_sq must all be defined");
#if TD_WITH_CUDA
  if (p.is_cuda()) {
    for (const Tensor* t : {&g, &m, &v}) ops::check_same_device(p, *t, op);
  } else {
    for (const Tensor* t : {&p, &g, &m, &v}) ops::check_cpu(*t, op);
  }
#else
  for (const Tensor* t : {&p, &g, &m, &v}) ops::check_cpu(*t, op);
#endif
  TD_CHECK(p.is_floating_point(), op, where, ": param must be float32, bfloat16 or float16, got ",
           describe(p));
  TD_CHECK(g.dtype() == p.dtype() || g.dtype() == DType::Float32, op, where, ": grad ", describe(g),
           " must have the param's dtype or float32 (param ", describe(p), ")");
  TD_CHECK(m.dtype() == DType::Float32 && v.dtype() == DType::Float32, op, where,
           ": exp_avg and exp_avg_sq must be float32, got ", describe(m), " and ", describe(v));
  TD_CHECK(g.numel() == p.numel() && m.numel() == p.numel() && v.numel() == p.numel(), op, where,
           ": numel mismatch: param ", describe(p), ", grad ", describe(g), ", exp_avg ",
           describe(m), ", exp_avg_sq ", describe(v));
  TD_CHECK(p.is_contiguous() && g.is_contiguous() && m.is_contiguous() && v.is_contiguous(), op,
           where, ": param, grad, exp_avg and exp_avg_sq must be contiguous (got strides ",
           shape_str(p.strides()), ", ", shape_str(g.strides()), ", ", shape_str(m.strides()), ", ",
           shape_str(v.strides()), ")");
}

// Equal list lengths and every (param, grad, exp_avg, exp_avg_sq) as check_group wants.
void check_lists(const char* op, const TensorList& params, const TensorList& grads,
                 const TensorList& exp_avgs, const TensorList& exp_avg_sqs) {
  TD_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() &&
               exp_avg_sqs.size() == params.size(),
           op, ": list lengths differ: ", params.size(), " params, ", grads.size(), " grads, ",
           exp_avgs.size(), " exp_avgs, ", exp_avg_sqs.size(), " exp_avg_sqs");
  for (size_t k = 0; k < params.size(); ++k) {
    check_group(params[k], grads[k], exp_avgs[k], exp_avg_sqs[k],
                " (tensor " + std::to_string(k) + ")");
  }
}

// Elements [b, e) of one parameter.
template <typename TP, typename TG>
void adamw_range(TP* __restrict__ p, const TG* __restrict__ g, float* __restrict__ m,
                 float* __restrict__ v, int64_t b, int64_t e, const Coeffs& c) {
  for (int64_t i = b; i < e; ++i) {
    float gi = static_cast<float>(g[i]);
    float pi = static_cast<float>(p[i]) * c.decay;
    float mi = m[i] + c.one_minus_b1 * (gi - m[i]);  // torch's lerp (weight < 0.5)
    float vi = c.b2 * v[i] + c.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = static_cast<TP>(pi - c.step_size * mi / (std::sqrt(vi) / c.bc2_sqrt + c.eps));
  }
}

void adamw_dispatch(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t b,
                    int64_t e, const Coeffs& c) {
  TD_DISPATCH_FLOATING(p.dtype(), "adamw_step", [&]<typename TP>() {
    float* mp = m.data_ptr<float>();
    float* vp = v.data_ptr<float>();
    TP* pp = static_cast<TP*>(p.data_ptr());
    if (g.dtype() == p.dtype()) {
      adamw_range<TP, TP>(pp, static_cast<const TP*>(g.data_ptr()), mp, vp, b, e, c);
    } else {
      adamw_range<TP, float>(pp, static_cast<const float*>(g.data_ptr()), mp, vp, b, e, c);
    }
  });
}

// The CPU tensors `on_cpu` of the lists, in one parallel region.
void adamw_cpu(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
               const TensorList& exp_avg_sqs, const std::vector<size_t>& on_cpu, const Coeffs& c) {
  // One flat list of fixed-size chunks over all tensors, split across threads in one region:
  // small tensors (biases, norms) share a thread instead of each paying a fork/join.
  struct Chunk {
    size_t k;
    int64_t b, e;
  };
  constexpr int64_t kChunk = 16384;
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (size_t k : on_cpu) {
    total += params[k].numel();
    for (int64_t b = 0; b < params[k].numel(); b += kChunk) {
      chunks.push_back({k, b, std::min(params[k].numel(), b + kChunk)});
    }
  }
  int64_t grain = std::max<int64_t>(1, cpu::kGrain / kChunk);
  if (total < cpu::kGrain) grain = static_cast<int64_t>(chunks.size());  // one thread
  cpu::parallel_for(static_cast<int64_t>(chunks.size()), grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Chunk& ch = chunks[i];
      adamw_dispatch(params[ch.k], grads[ch.k], exp_avgs[ch.k], exp_avg_sqs[ch.k], ch.b, ch.e, c);
    }
  });
}

#if TD_WITH_CUDA
cuda_ops::AdamWScalars scalars(const Coeffs& c) {
  return {c.decay, c.one_minus_b1, c.b2, c.one_minus_b2, c.step_size, c.bc2_sqrt, c.eps};
}
#endif

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWConfig& cfg) {
  check_group(param, grad, exp_avg, exp_avg_sq, "");
  Coeffs c = make_coeffs(cfg);
#if TD_WITH_CUDA
  if (param.is_cuda()) {
    return cuda_ops::adamw_step({param}, {grad}, {exp_avg}, {exp_avg_sq}, scalars(c));
  }
#endif
  cpu::parallel_for(param.numel(), cpu::kGrain, [&](int64_t b, int64_t e) {
    adamw_dispatch(param, grad, exp_avg, exp_avg_sq, b, e, c);
  });
}

void adamw_step(TensorList& params, const TensorList& grads, TensorList& exp_avgs,
                TensorList& exp_avg_sqs, const AdamWConfig& cfg) {
  check_lists("adamw_step", params, grads, exp_avgs, exp_avg_sqs);
  Coeffs c = make_coeffs(cfg);
  // CUDA tensors go to the multi-tensor kernel (one launch per device and dtype pair), the
  // rest stay here.
  std::vector<size_t> on_cpu;
#if TD_WITH_CUDA
  TensorList cp, cg, cm, cv;
  for (size_t k = 0; k < params.size(); ++k) {
    if (params[k].is_cuda()) {
      cp.push_back(params[k]);
      cg.push_back(grads[k]);
      cm.push_back(exp_avgs[k]);
      cv.push_back(exp_avg_sqs[k]);
    } else {
      on_cpu.push_back(k);
    }
  }
  if (!cp.empty()) cuda_ops::adamw_step(cp, cg, cm, cv, scalars(c));
#else
  for (size_t k = 0; k < params.size(); ++k) on_cpu.push_back(k);
#endif
  adamw_cpu(params, grads, exp_avgs, exp_avg_sqs, on_cpu, c);
}

// Note [Capturable AdamW]: a captured optimizer step (Note [CUDA graphs]) replays its kernels
// with the arguments they were captured with, so a step count and learning rate passed by
// value would stay those of the capture. Here both live in 0-dim float32 tensors on the
// parameters' device: the step is incremented there and the seven coefficients of the update
// (make_coeffs's) are formed from it with tensor ops into a device tensor that the kernel reads.
// Those ops run in float32 where make_coeffs works in double and rounds once, so the two paths
// can differ in the last bit of a coefficient (relative 1e-7). On the CPU the same
// coefficients are read back and the CPU loop runs.
void adamw_step_capturable(TensorList& params, const TensorList& grads, TensorList& exp_avgs,
                           TensorList& exp_avg_sqs, const Tensor& lr, Tensor& step, double beta1,
                           double beta2, double eps, double weight_decay) {
  const char* op = "adamw_step_capturable";
  check_lists(op, params, grads, exp_avgs, exp_avg_sqs);
  TD_CHECK(!params.empty(), op, ": no parameters");
  for (const Tensor& p : params) ops::check_same_device(params[0], p, op);
  for (const Tensor* t : {&lr, static_cast<const Tensor*>(&step)}) {
    TD_CHECK(t->defined() && t->dim() == 0 && t->dtype() == DType::Float32, op,
             ": lr and step must be 0-dim float32 tensors, got ",
             t->defined() ? describe(*t) : std::string("an undefined tensor"));
    ops::check_same_device(params[0], *t, op);
  }
  make_coeffs({0.0, beta1, beta2, eps, weight_decay, 1});  // checks the constants' ranges
  autograd::NoGradGuard ng;
  const Device dev = params[0].device();
  auto constant = [&](double v) { return full({1}, v, {DType::Float32, dev}); };
  add_(step, full({}, 1.0, {DType::Float32, dev}));
  const Tensor t = step.reshape({1});
  const Tensor bc1 = rsub(exp(mul(t, std::log(beta1))), 1.0);  // 1 - beta1^t
  const Tensor bc2 = rsub(exp(mul(t, std::log(beta2))), 1.0);
  const Tensor l = lr.reshape({1});
  const Tensor coeffs =
      cat({rsub(mul(l, weight_decay), 1.0), constant(1.0 - beta1), constant(beta2),
           constant(1.0 - beta2), div(l, bc1), sqrt(bc2), constant(eps)},
          0);
#if TD_WITH_CUDA
  if (dev.is_cuda()) {
    return cuda_ops::adamw_step_device_coeffs(params, grads, exp_avgs, exp_avg_sqs, coeffs);
  }
#endif
  const std::vector<float> h = to_vector<float>(coeffs);
  const Coeffs c{h[0], h[1], h[2], h[3], h[4], h[5], h[6]};
  std::vector<size_t> all(params.size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = k;
  adamw_cpu(params, grads, exp_avgs, exp_avg_sqs, all, c);
}

}  // namespace td
