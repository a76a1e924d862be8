// Expert parallelism (include/tardelli/parallel/expert_parallel.h) at 2 and 4 ranks: the MoE
// layer with its experts split over the world (ep = world size), each rank routing its own
// tokens, against the one-device layer run on every rank's tokens together.
//
// Property: the outputs of this rank's tokens, their input gradients and this rank's experts'
// weight gradients equal the one-device layer's (the same rows go through the same experts,
// only regrouped and moved), and the router's gradient summed over ranks equals the one-device
// router gradient (each rank's tokens contribute their part). Dropless, balancing losses off
// (they are per-rank statistics by design). Tolerance: 1e-5 of each tensor's largest magnitude
// (fp32; the per-expert GEMMs see their rows in another grouping, so sums may be re-associated
// by the GEMM's blocking, a few ulps); a row sent to the wrong expert or returned to the wrong
// slot changes values by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/autograd/engine.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/models/gpt.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/parallel/expert_parallel.h"

#include "distributed/parallel_test_util.h"
#include "test_util.h"

namespace td::parallel {
namespace {

using distributed::CommPtr;
using parallel_test::leaf;

CommPtr world() {
  static CommPtr w = distributed::mpi_world();
  return w;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  parallel_test::expect_close(got.contiguous(), want.contiguous(), 1e-5, what);
}

void check(bool gpt2, int64_t top_k) {
  const CommPtr ep = world();
  const int64_t n = ep->size(), r = ep->rank();
  const int64_t E = 8, El = E / n, d = 16, H = 12, F = gpt2 ? H : 2 * H, T = 10;
  const std::string tag = std::string(gpt2 ? "gpt2" : "llama") + " top_k " + std::to_string(top_k) +
                          " ep " + std::to_string(n) + ": ";
  Generator g(99);  // the same values on every rank
  models::MoEParams full;
  full.router_w = leaf(mul(randn({E, d}, {}, &g), 0.5));
  full.expert_bias = zeros({E});
  full.fc_w = leaf(mul(randn({E, F, d}, {}, &g), 0.2));
  full.proj_w = leaf(mul(randn({E, d, H}, {}, &g), 0.2));
  if (gpt2) {
    full.fc_b = leaf(mul(randn({E, H}, {}, &g), 0.1));
    full.proj_b = leaf(mul(randn({E, d}, {}, &g), 0.1));
  }
  const Tensor x_all = randn({n * T, d}, {}, &g), dy_all = randn({n * T, d}, {}, &g);

  models::MoEOptions o;
  o.num_experts = E;
  o.top_k = top_k;
  o.act = gpt2 ? MlpActivation::GeluTanh : MlpActivation::SwiGLU;
  o.training = true;
  const models::MoECastFn cast = [](const Tensor& t, DType dt) {
    return t.defined() && t.dtype() != dt ? t.to(dt) : t;
  };

  // One device, every rank's tokens.
  Tensor xr = leaf(x_all);
  models::MoEForward want = models::moe_mlp(xr, full, o, cast);
  want.y.backward(dy_all);

  // Expert parallel: this rank's tokens and experts.
  models::MoEParams mine;
  mine.router_w = leaf(full.router_w);
  mine.expert_bias = full.expert_bias;
  const auto slice = [&](const Tensor& t) {
    return t.defined() ? leaf(t.narrow(0, r * El, El)) : Tensor();
  };
  mine.fc_w = slice(full.fc_w);
  mine.proj_w = slice(full.proj_w);
  mine.fc_b = slice(full.fc_b);
  mine.proj_b = slice(full.proj_b);
  models::MoEOptions oe = o;
  oe.dispatch = expert_parallel_dispatch(ep);
  Tensor x = leaf(x_all.narrow(0, r * T, T));
  models::MoEForward got = models::moe_mlp(x, mine, oe, cast);
  got.y.backward(dy_all.narrow(0, r * T, T).contiguous());

  expect_close(got.y, want.y.narrow(0, r * T, T), tag + "output");
  expect_close(x.grad(), xr.grad().narrow(0, r * T, T), tag + "input gradient");
  expect_close(mine.fc_w.grad(), full.fc_w.grad().narrow(0, r * El, El), tag + "c_fc gradient");
  expect_close(mine.proj_w.grad(), full.proj_w.grad().narrow(0, r * El, El),
               tag + "c_proj gradient");
  if (gpt2) {
    expect_close(mine.fc_b.grad(), full.fc_b.grad().narrow(0, r * El, El), tag + "c_fc bias");
    expect_close(mine.proj_b.grad(), full.proj_b.grad().narrow(0, r * El, El), tag + "c_proj bias");
  }
  const Tensor router = distributed::all_reduce_copy(mine.router_w.grad(), ep);
  expect_close(router, full.router_w.grad(), tag + "router gradient (summed over ranks)");
  // The statistics are this rank's: its tokens' routed slots.
  int64_t slots = 0;
  for (int64_t c : got.routed_per_expert) slots += c;
  EXPECT_EQ(slots, T * top_k) << tag;
}

TEST(ExpertParallel, LlamaMatchesOneDevice) {
  check(/*gpt2=*/false, 2);
  check(/*gpt2=*/false, 1);
}

TEST(ExpertParallel, Gpt2MatchesOneDevice) {
  check(/*gpt2=*/true, 2);
}

// The GPT laid out by apply_expert_parallel (ep = world): each rank feeds its own micro-batch.
// Property: the mean of the ranks' losses is the one-device loss on all ranks' micro-batches
// together (equal token counts); a dense parameter's or the router's gradient averaged over
// ranks is the one-device gradient; a local expert's gradient, which collects every rank's
// tokens, divided by ep is the one-device gradient of that expert (the loss is the mean of the
// ranks' means). llama and gpt2, E = 4 experts (1 or 2 per rank), top-2, balancing losses off
// (per-rank statistics); tolerances as above.
TEST(ExpertParallel, GptMatchesOneDevice) {
  const CommPtr ep = world();
  const int64_t n = ep->size(), r = ep->rank();
  for (auto arch : {models::Arch::Llama, models::Arch::GPT2}) {
    models::GPTConfig c;
    c.arch = arch;
    c.vocab_size = 40;
    c.block_size = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.d_model = 16;
    c.num_experts = 4;
    c.moe_top_k = 2;
    c.moe_ffn_hidden = 12;
    c.moe_aux_loss_coeff = 0.0;
    c.moe_z_loss_coeff = 0.0;
    c.seed = 5;
    const std::string tag = arch == models::Arch::Llama ? "llama: " : "gpt2: ";
    Generator g(21);
    const Tensor idx = randint(0, 40, {n * 2, 8}, {DType::Int64}, &g);
    const Tensor tgt = randint(0, 40, {n * 2, 8}, {DType::Int64}, &g);
    auto one = std::make_shared<models::GPT>(c);
    Tensor want = one->forward(idx, tgt);
    want.backward();
    auto par = std::make_shared<models::GPT>(c);
    apply_expert_parallel(*par, ep);
    ASSERT_EQ(par->ep_size(), n);
    Tensor loss = par->forward(idx.narrow(0, 2 * r, 2), tgt.narrow(0, 2 * r, 2));
    loss.backward();
    const double mean = distributed::all_reduce_copy(loss.detach(), ep).item_double() / n;
    EXPECT_NEAR(mean, want.item_double(), 1e-6 * std::fabs(want.item_double())) << tag << "loss";
    std::map<std::string, Tensor> ref;
    for (auto& [name, p] : one->named_parameters()) ref[name] = p.grad();
    const int64_t El = c.num_experts / n;
    int64_t experts_seen = 0;
    for (auto& [name, p] : par->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << tag << name;
      if (name.find(".mlp.experts.") != std::string::npos) {
        ++experts_seen;
        EXPECT_EQ(p.size(0), El) << tag << name;
        expect_close(mul(p.grad(), 1.0 / n), ref.at(name).narrow(0, r * El, El), tag + name);
      } else {
        expect_close(mul(distributed::all_reduce_copy(p.grad(), ep), 1.0 / n), ref.at(name),
                     tag + name);
      }
    }
    EXPECT_GT(experts_seen, 0) << tag;
  }
}

// Experts that do not split over ep are refused with the numbers, on every rank alike.
TEST(ExpertParallel, UnevenExpertsRaise) {
  const CommPtr ep = world();
  const auto dispatch = expert_parallel_dispatch(ep);
  const int64_t E = ep->size() + 1;
  std::vector<int64_t> per_expert(static_cast<size_t>(E), 0);
  per_expert[0] = 2;
  const Tensor rows = zeros({2, 4});
  const std::string msg = td::test::error_of([&] {
    dispatch(rows, per_expert, [](const Tensor& t, const std::vector<int64_t>&) { return t; });
  });
  EXPECT_NE(msg.find(std::to_string(E) + " experts do not split evenly over ep " +
                     std::to_string(ep->size())),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace td::parallel
