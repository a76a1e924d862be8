// The mixture-of-experts MLP (models/moe_mlp.h) against a dense MLP with the same active FLOPs:
// forward + backward time per token on this machine. Issue 21's target: the MoE layer with
// E = 8 experts and top-k K = 2 within 1.5x the dense MLP's time.
//   ./build/<dir>/benchmarks/bench_moe [tokens] [d_model] [dense_hidden]
// Both are SwiGLU (llama) MLPs over T tokens of width d: the dense one has hidden size H, each
// expert H / K, so every token does the same GEMM FLOPs in both (2 x 3 x d x H multiply-adds
// forward, twice that backward); the MoE layer adds the router ([T, d] x [d, E]), top-k, the
// permutation of the rows and the gate-weighted combine, and its GEMMs run per expert on about
// T K / E rows each. Dropless, fp32, the router's balancing loss on (coefficient 0.01) so its
// backward runs too. One JSON line per layer kind, then a summary line with the ratio.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "tardelli/models/moe_mlp.h"
#include "tardelli/tardelli.h"

namespace {

using td::bench::median;
using td::bench::now;

td::Tensor param(const td::Shape& shape, double std, td::Generator& g) {
  return td::mul(td::randn(shape, {}, &g), std).set_requires_grad(true);
}

// Median seconds of fwd + bwd over `runs` timed runs after one warm-up; clears grads each run.
template <typename Fn>
double time_fwd_bwd(Fn&& step, const std::vector<td::Tensor>& params, int runs) {
  std::vector<double> t;
  for (int it = 0; it <= runs; ++it) {
    for (td::Tensor p : params) p.set_grad(td::Tensor());
    const double t0 = now();
    step();
    if (it > 0) t.push_back(now() - t0);
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int64_t d = argc > 2 ? std::atoll(argv[2]) : 512;
  const int64_t H = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int64_t E = 8, K = 2, He = H / K;
  const int runs = 5;
  td::Generator g(7);
  td::Tensor x = td::randn({T, d}, {}, &g).set_requires_grad(true);
  td::Tensor dy = td::randn({T, d}, {}, &g);
  const double std_w = 0.02, std_proj = 0.02 / 2;

  // Dense SwiGLU MLP: c_fc [2H, d], c_proj [d, H].
  td::Tensor fc = param({2 * H, d}, std_w, g), proj = param({d, H}, std_proj, g);
  const double dense_s = time_fwd_bwd(
      [&] {
        td::Tensor y = td::activation_linear(td::linear(x, fc), td::MlpActivation::SwiGLU, proj);
        y.backward(dy);
      },
      {x, fc, proj}, runs);

  // MoE: router [E, d], experts c_fc [E, 2He, d], c_proj [E, d, He].
  td::models::MoEParams p;
  p.router_w = param({E, d}, std_w, g);
  p.expert_bias = td::zeros({E});
  p.fc_w = param({E, 2 * He, d}, std_w, g);
  p.proj_w = param({E, d, He}, std_proj, g);
  td::models::MoEOptions o;
  o.num_experts = E;
  o.top_k = K;
  o.act = td::MlpActivation::SwiGLU;
  o.aux_loss_coeff = 0.01;
  o.training = true;
  const td::models::MoECastFn cast = [](const td::Tensor& t, td::DType dt) {
    return t.defined() && t.dtype() != dt ? t.to(dt) : t;
  };
  std::vector<int64_t> load(E, 0);
  const double moe_s = time_fwd_bwd(
      [&] {
        td::models::MoEForward f = td::models::moe_mlp(x, p, o, cast);
        td::autograd::backward({f.y, f.loss}, {dy, td::Tensor()});
        load = f.routed_per_expert;
      },
      {x, p.router_w, p.fc_w, p.proj_w}, runs);

  const double gemm_flop = 2.0 * 3.0 * T * d * H * 3.0;  // fwd + 2x bwd, both layers alike
  const int64_t max_load = *std::max_element(load.begin(), load.end());
  std::printf(
      "{\"bench\": \"moe_layer\", \"layer\": \"dense\", \"tokens\": %lld, \"d_model\": %lld, "
      "\"hidden\": %lld, \"fwd_bwd_ms\": %.2f, \"tokens_per_s\": %.0f, \"gemm_gflops\": %.1f}\n",
      static_cast<long long>(T), static_cast<long long>(d), static_cast<long long>(H),
      dense_s * 1e3, T / dense_s, gemm_flop / dense_s * 1e-9);
  std::printf(
      "{\"bench\": \"moe_layer\", \"layer\": \"moe\", \"tokens\": %lld, \"d_model\": %lld, "
      "\"experts\": %lld, \"top_k\": %lld, \"expert_hidden\": %lld, \"fwd_bwd_ms\": %.2f, "
      "\"tokens_per_s\": %.0f, \"gemm_gflops\": %.1f, \"max_load_ratio\": %.3f}\n",
      static_cast<long long>(T), static_cast<long long>(d), static_cast<long long>(E),
      static_cast<long long>(K), static_cast<long long>(He), moe_s * 1e3, T / moe_s,
      gemm_flop / moe_s * 1e-9, static_cast<double>(max_load) * E / static_cast<double>(T * K));
  std::printf(
      "{\"bench\": \"moe_layer_summary\", \"moe_vs_dense_time\": %.3f, \"target\": 1.5, "
      "\"threads\": %d}\n",
      moe_s / dense_s, omp_get_max_threads());
  return 0;
}
