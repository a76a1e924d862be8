// The router (ops/moe_router.h): top-k order and its tie rule, gates from the unbiased
// probabilities, the load-balancing and z losses against their formulas (values and gradients),
// the aux-loss-free bias update's sign rule and its effect on a skewed router, and bad input.
#include "tardelli/ops/moe_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::test::error_of;

// Descending order; equal scores go to the lower index, wherever they sit in the row.
TEST(MoERouter, TopKOrderAndTies) {
  Tensor s = from_vector<float>({0.1f, 0.5f, 0.5f, 0.2f,  //
                                 0.3f, 0.3f, 0.3f, 0.3f,  //
                                 -1.0f, 2.0f, 0.0f, 2.0f},
                                {3, 4});
  EXPECT_EQ(to_vector<int64_t>(moe_topk(s, 3)), (std::vector<int64_t>{1, 2, 3, 0, 1, 2, 1, 3, 2}));
  EXPECT_EQ(to_vector<int64_t>(moe_topk(s, 1)), (std::vector<int64_t>{1, 0, 1}));
}

// Gates are the chosen experts' probabilities, normalized over the k for top_k > 1 and raw for
// top-1; the bias changes which experts are chosen but not their gate values.
TEST(MoERouter, GatesUseUnbiasedProbabilities) {
  Tensor x = td::test::randn_seeded({6, 8}, 1), w = td::test::randn_seeded({4, 8}, 2);
  const std::vector<float> p = to_vector<float>(softmax(linear(x, w), 1));
  Tensor bias = from_vector<float>({0.0f, 0.0f, 0.0f, 10.0f}, {4});  // expert 3 always chosen
  for (bool with_bias : {false, true}) {
    for (int64_t k : {1, 2}) {
      MoERouting r = moe_route(x, w, k, with_bias ? bias : Tensor());
      const std::vector<int64_t> idx = to_vector<int64_t>(r.expert_index);
      const std::vector<float> g = to_vector<float>(r.gates);
      for (int64_t t = 0; t < 6; ++t) {
        if (with_bias) {
          EXPECT_EQ(idx[t * k], 3);
        }
        double total = 0;
        for (int64_t j = 0; j < k; ++j) total += p[t * 4 + idx[t * k + j]];
        for (int64_t j = 0; j < k; ++j) {
          const double want = p[t * 4 + idx[t * k + j]] / (k > 1 ? total : 1.0);
          EXPECT_NEAR(g[t * k + j], want, 1e-6);
        }
      }
    }
  }
}

// aux = E * sum_e f_e P_e; its gradient w.r.t. probs[t, e] is E * f_e / T.
TEST(MoERouter, AuxLossFormula) {
  const int64_t T = 5, E = 4, K = 2;
  Tensor probs = softmax(td::test::randn_seeded({T, E}, 3), 1).detach().set_requires_grad(true);
  const std::vector<int64_t> counts = {4, 1, 0, 5};  // 10 = T * K slots
  Tensor aux = moe_aux_loss(probs, counts, K);
  const std::vector<float> p = to_vector<float>(probs);
  double want = 0;
  for (int64_t e = 0; e < E; ++e) {
    double P = 0;
    for (int64_t t = 0; t < T; ++t) P += p[t * E + e];
    want += (counts[e] / 10.0) * (P / T);
  }
  EXPECT_NEAR(aux.item<double>(), E * want, 1e-6);
  aux.backward();
  const std::vector<float> g = to_vector<float>(probs.grad());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(g[t * E + e], E * (counts[e] / 10.0) / T, 1e-6);
  // Uniform routing and probabilities give exactly 1.
  EXPECT_NEAR(moe_aux_loss(full({8, 4}, 0.25), {4, 4, 4, 4}, 2).item<double>(), 1.0, 1e-7);
}

// z = mean_t logsumexp(l_t)^2; its gradient is 2 lse_t softmax(l_t) / T. Large logits do not
// overflow.
TEST(MoERouter, ZLossFormula) {
  const int64_t T = 3, E = 5;
  Tensor l = td::test::randn_seeded({T, E}, 4, 3.0, 40.0).detach().set_requires_grad(true);
  Tensor z = moe_z_loss(l);
  const std::vector<float> lv = to_vector<float>(l);
  double want = 0;
  std::vector<double> lse(T);
  for (int64_t t = 0; t < T; ++t) {
    double m = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, static_cast<double>(lv[t * E + e]));
    for (int64_t e = 0; e < E; ++e) s += std::exp(lv[t * E + e] - m);
    lse[t] = m + std::log(s);
    want += lse[t] * lse[t] / T;
  }
  EXPECT_NEAR(z.item<double>(), want, 1e-5 * want);
  z.backward();
  const std::vector<float> g = to_vector<float>(l.grad());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const double sm = std::exp(lv[t * E + e] - lse[t]);
      EXPECT_NEAR(g[t * E + e], 2 * lse[t] * sm / T, 1e-4);
    }
  }
}

TEST(MoERouter, BiasUpdateSignRule) {
  Tensor b = zeros({4});
  moe_update_expert_bias(b, {10, 2, 4, 0}, 0.5);  // mean 4
  EXPECT_EQ(to_vector<float>(b), (std::vector<float>{-0.5f, 0.5f, 0.0f, 0.5f}));
  moe_update_expert_bias(b, {10, 2, 4, 0}, 0.0);  // rate 0: no change
  EXPECT_EQ(to_vector<float>(b), (std::vector<float>{-0.5f, 0.5f, 0.0f, 0.5f}));
}

// A router that sends most tokens to expert 0: repeated bias updates from the observed loads
// move the loads toward uniform (max/mean from > 2 to near 1), while the gates stay the unbiased
// probabilities.
TEST(MoERouter, AuxFreeBiasBalancesASkewedRouter) {
  const int64_t T = 256, E = 4, K = 1, d = 8;
  Tensor x = td::test::randn_seeded({T, d}, 5);
  Tensor w = td::test::randn_seeded({E, d}, 6, 0.3);
  {
    autograd::NoGradGuard ng;
    // Skew: expert 0's logit gets +1.5 for every token (a column of x is ~constant).
    copy_into(x.narrow(1, 0, 1), full({T, 1}, 1.0));
    copy_into(w.narrow(0, 0, 1).narrow(1, 0, 1), full({1, 1}, 1.5));
  }
  auto loads = [&](const Tensor& bias) {
    MoERouting r = moe_route(x, w, K, bias);
    return moe_dispatch(r.expert_index, E).routed_per_expert;
  };
  auto ratio = [&](const std::vector<int64_t>& l) {
    return static_cast<double>(*std::max_element(l.begin(), l.end())) / (T * K / E);
  };
  Tensor bias = zeros({E});
  const double before = ratio(loads(bias));
  EXPECT_GT(before, 2.0);
  for (int step = 0; step < 400; ++step) moe_update_expert_bias(bias, loads(bias), 5e-3);
  const double after = ratio(loads(bias));
  EXPECT_LT(after, 1.25) << "before " << before;
}

TEST(MoERouter, BadInputsNameTheValues) {
  Tensor x = randn({3, 8}), w = randn({4, 8});
  EXPECT_NE(error_of([&] {
              moe_route(x, w, 5);
            }).find("top_k must be in [1, num_experts = 4], got top_k 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] { moe_topk(randn({2, 3}), 0); }).find("got top_k 0"), std::string::npos);
  EXPECT_NE(error_of([&] {
              moe_route(x, randn({4, 6}), 2);
            }).find("router weight must be [num_experts, 8]"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { moe_route(x, w, 2, zeros({3})); }).find("expert_bias must be float32 [4]"),
      std::string::npos);
  Tensor nan_scores = from_vector<float>({0.0f, NAN}, {1, 2});
  EXPECT_NE(error_of([&] { moe_topk(nan_scores, 1); }).find("token 0, expert 1 is NaN"),
            std::string::npos);
}
