#include "tardelli/models/moe_mlp.h"

#include <algorithm>
#include <numeric>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/models/gpt.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/grouped_linear.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/moe_dispatch.h"
#include "tardelli/ops/moe_router.h"

namespace td::models {

std::vector<std::pair<std::string, Tensor*>> MoEParams::slots() {
  const std::pair<const char*, Tensor*> fields[] = {
      {"router.weight", &router_w},          {"experts.c_fc.weight", &fc_w},
      {"experts.c_fc.bias", &fc_b},          {"experts.c_proj.weight", &proj_w},
      {"experts.c_proj.bias", &proj_b},      {"shared.c_fc.weight", &shared_fc_w},
      {"shared.c_fc.bias", &shared_fc_b},    {"shared.c_proj.weight", &shared_proj_w},
      {"shared.c_proj.bias", &shared_proj_b}};
  std::vector<std::pair<std::string, Tensor*>> s;
  for (const auto& [n, t] : fields) {
    if (t->defined()) s.emplace_back(n, t);
  }
  return s;
}

int64_t moe_hidden_size(const GPTConfig& c) {
  return c.moe_ffn_hidden > 0 ? c.moe_ffn_hidden : ffn_hidden_size(c);
}

MoEParams register_moe_mlp(nn::Module& block, int64_t i, const GPTConfig& c, double std_w,
                           double std_proj, const MoEInitFn& normal) {
  const bool gpt2 = c.arch == Arch::GPT2;
  const int64_t E = c.num_experts, d = c.d_model, H = moe_hidden_size(c);
  const int64_t F = gpt2 ? H : 2 * H;  // c_fc's rows per expert (llama: gate, then up)
  const std::string pre = "h." + std::to_string(i) + ".mlp.";
  const auto child = [](nn::Module& parent, const std::string& name, const std::string& type) {
    return parent.register_module(name, std::make_shared<nn::Module>(type));
  };
  MoEParams p;
  auto mlp = child(block, "mlp", "MoE");
  auto router = child(*mlp, "router", "TopKRouter");
  p.router_w = router->register_parameter("weight", normal(pre + "router.weight", {E, d}, std_w));
  p.expert_bias = router->register_buffer("expert_bias", zeros({E}));
  auto experts = child(*mlp, "experts", "GroupedMLP");
  auto fc = child(*experts, "c_fc", "GroupedLinear");
  p.fc_w = fc->register_parameter("weight", normal(pre + "experts.c_fc.weight", {E, F, d}, std_w));
  if (gpt2) p.fc_b = fc->register_parameter("bias", zeros({E, H}));
  auto proj = child(*experts, "c_proj", "GroupedLinear");
  p.proj_w = proj->register_parameter("weight",
                                      normal(pre + "experts.c_proj.weight", {E, d, H}, std_proj));
  if (gpt2) p.proj_b = proj->register_parameter("bias", zeros({E, d}));
  if (c.moe_shared_experts > 0) {
    const int64_t S = c.moe_shared_experts;
    auto shared = child(*mlp, "shared", "MLP");
    auto sfc = child(*shared, "c_fc", "Linear");
    p.shared_fc_w =
        sfc->register_parameter("weight", normal(pre + "shared.c_fc.weight", {S * F, d}, std_w));
    if (gpt2) p.shared_fc_b = sfc->register_parameter("bias", zeros({S * H}));
    auto sproj = child(*shared, "c_proj", "Linear");
    p.shared_proj_w = sproj->register_parameter(
        "weight", normal(pre + "shared.c_proj.weight", {d, S * H}, std_proj));
    if (gpt2) p.shared_proj_b = sproj->register_parameter("bias", zeros({d}));
  }
  return p;
}

MoEOptions MoEOptions::from_config(const GPTConfig& c, bool training, bool fuse_act) {
  MoEOptions o;
  o.num_experts = c.num_experts;
  o.top_k = c.moe_top_k;
  o.act = c.arch == Arch::GPT2 ? MlpActivation::GeluTanh : MlpActivation::SwiGLU;
  o.norm_topk = c.moe_norm_topk;
  o.capacity_factor = c.moe_capacity_factor;
  o.aux_loss_coeff = c.moe_aux_loss_coeff;
  o.z_loss_coeff = c.moe_z_loss_coeff;
  o.training = training;
  o.fuse_act = fuse_act;
  return o;
}

MoEForward moe_mlp(const Tensor& x, const MoEParams& p, const MoEOptions& o,
                   const MoECastFn& cast_to) {
  const DType dt = x.dtype();
  const auto cast = [&](const Tensor& w) { return cast_to(w, dt); };
  const int64_t d = x.size(-1);
  const Tensor x2 = x.reshape({-1, d});
  const int64_t T = x2.size(0), K = o.top_k, E = o.num_experts;
  const MoERouting r =
      moe_route(x2, cast_to(p.router_w, DType::Float32), K, p.expert_bias, o.norm_topk);
  const int64_t capacity =
      o.training && o.capacity_factor > 0 ? moe_capacity(o.capacity_factor, T, K, E) : -1;
  const MoEDispatch disp = moe_dispatch(r.expert_index, E, capacity, x.device());

  // The experts this device holds: c_fc, then c_proj on the activation (recomputed in backward
  // when fuse_act), on rows grouped by local expert (Note [Expert dispatch]).
  const MoELocalExperts local = [&](const Tensor& rows, const std::vector<int64_t>& sizes) {
    const Tensor h = grouped_linear(rows, cast(p.fc_w), cast(p.fc_b), sizes);
    return o.fuse_act
               ? grouped_linear(h, cast(p.proj_w), cast(p.proj_b), sizes, o.act)
               : grouped_linear(mlp_activation(h, o.act), cast(p.proj_w), cast(p.proj_b), sizes);
  };
  const Tensor rows = moe_permute(x2, disp);
  const Tensor e = o.dispatch ? o.dispatch(rows, disp.tokens_per_expert, local)
                              : local(rows, disp.tokens_per_expert);
  Tensor y = moe_unpermute(e, r.gates, disp);
  if (p.shared_fc_w.defined()) {
    const Tensor hs = linear(x2, cast(p.shared_fc_w), cast(p.shared_fc_b));
    y = add(y,
            o.fuse_act
                ? activation_linear(hs, o.act, cast(p.shared_proj_w), cast(p.shared_proj_b))
                : linear(mlp_activation(hs, o.act), cast(p.shared_proj_w), cast(p.shared_proj_b)));
  }
  MoEForward out;
  out.y = y.reshape(x.sizes());
  if (!o.training) return out;

  out.routed_per_expert = disp.routed_per_expert;
  out.tokens = T;
  out.dropped = disp.dropped;
  // A loss with a zero coefficient is still measured, outside the graph.
  Tensor aux, z;
  {
    autograd::GradModeGuard g(autograd::grad_enabled() && o.aux_loss_coeff > 0);
    aux = moe_aux_loss(r.probs, disp.routed_per_expert, K);
  }
  {
    autograd::GradModeGuard g(autograd::grad_enabled() && o.z_loss_coeff > 0);
    z = moe_z_loss(r.logits);
  }
  out.aux_loss = aux.item_double();
  out.z_loss = z.item_double();
  if (o.aux_loss_coeff > 0) out.loss = mul(aux, o.aux_loss_coeff);
  if (o.z_loss_coeff > 0) {
    const Tensor zl = mul(z, o.z_loss_coeff);
    out.loss = out.loss.defined() ? add(out.loss, zl) : zl;
  }
  return out;
}

void MoELayerStats::add(const MoEForward& f) {
  if (tokens_per_expert.size() < f.routed_per_expert.size())
    tokens_per_expert.resize(f.routed_per_expert.size(), 0);
  for (size_t e = 0; e < f.routed_per_expert.size(); ++e)
    tokens_per_expert[e] += f.routed_per_expert[e];
  ++forwards;
  tokens += f.tokens;
  dropped += f.dropped;
  aux_loss += f.aux_loss;
  z_loss += f.z_loss;
}

int64_t MoELayerStats::max_load() const {
  return tokens_per_expert.empty()
             ? 0
             : *std::max_element(tokens_per_expert.begin(), tokens_per_expert.end());
}

double MoELayerStats::mean_load() const {
  if (tokens_per_expert.empty()) return 0.0;
  return static_cast<double>(
             std::accumulate(tokens_per_expert.begin(), tokens_per_expert.end(), int64_t{0})) /
         static_cast<double>(tokens_per_expert.size());
}

namespace {

double mean_over(const std::vector<MoELayerStats>& layers, double MoELayerStats::*field) {
  double s = 0;
  int64_t n = 0;
  for (const auto& l : layers) {
    s += l.*field;
    n += l.forwards;
  }
  return n > 0 ? s / static_cast<double>(n) : 0.0;
}

}  // namespace

double MoEStats::aux_loss() const {
  return mean_over(layers, &MoELayerStats::aux_loss);
}

double MoEStats::z_loss() const {
  return mean_over(layers, &MoELayerStats::z_loss);
}

int64_t MoEStats::dropped() const {
  int64_t n = 0;
  for (const auto& l : layers) n += l.dropped;
  return n;
}

double MoEStats::max_load_ratio() const {
  double r = 0;
  for (const auto& l : layers) {
    if (l.mean_load() > 0) r = std::max(r, static_cast<double>(l.max_load()) / l.mean_load());
  }
  return r;
}

}  // namespace td::models
