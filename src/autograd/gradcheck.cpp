#include "tardelli/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/factory.h"

namespace td::autograd {

namespace {

double projected(const Tensor& out, const std::vector<float>& w) {
  std::vector<float> v = to_vector<float>(out);
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += static_cast<double>(v[i]) * w[i];
  return s;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f,
                          const TensorList& inputs, const GradcheckOptions& opts) {
  for (const auto& t : inputs) {
    TD_CHECK(!t.defined() || !t.requires_grad() ||
                 (t.dtype() == DType::Float32 && t.is_cpu() && t.is_leaf()),
             "gradcheck: inputs that require grad must be float32 CPU leaves, got ", describe(t));
  }
  GradcheckResult res;
  Tensor out = f(inputs);
  Generator gen(opts.seed);
  Tensor wt = randn(out.sizes(), {}, &gen);
  std::vector<float> w = to_vector<float>(wt);
  for (const auto& t : inputs) {
    if (t.defined() && t.requires_grad()) t.set_grad(Tensor());
  }
  out.backward(wt);

  NoGradGuard ng;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    Tensor g = x.grad();
    std::vector<float> analytic = g.defined() ? to_vector<float>(g)
                                              : std::vector<float>(x.numel(), 0.0f);
    // Perturb the element in place through a strided walk over x's own storage.
    Shape idx(x.dim(), 0);
    for (int64_t j = 0; j < x.numel(); ++j) {
      int64_t off = x.storage_offset();
      for (int64_t d = 0; d < x.dim(); ++d) off += idx[d] * x.stride(d);
      float* p = static_cast<float*>(x.storage().data()) + off;
      float orig = *p;
      *p = static_cast<float>(orig + opts.eps);
      double fp = projected(f(inputs), w);
      *p = static_cast<float>(orig - opts.eps);
      double fm = projected(f(inputs), w);
      *p = orig;
      double numeric = (fp - fm) / (2 * opts.eps);
      double err = std::fabs(analytic[j] - numeric);
      res.max_abs_err = std::max(res.max_abs_err, err);
      if (res.ok && err > opts.atol + opts.rtol * std::fabs(numeric)) {
        std::ostringstream os;
        os << "gradcheck: input " << k << " (" << describe(x) << ") element " << j
           << ": analytic " << analytic[j] << " vs numeric " << numeric;
        res.ok = false;
        res.message = os.str();
      }
      for (int64_t d = x.dim() - 1; d >= 0; --d) {
        if (++idx[d] < x.size(d)) break;
        idx[d] = 0;
      }
    }
  }
  return res;
}

}  // namespace td::autograd
