// Token dispatch (ops/moe_dispatch.h): the plan's row order (by expert, then token, stable), the
// capacity dropping slots in token order with the count reported, permute/unpermute round trips
// that are exact, the gate-weighted combine against a loop over tokens, gradients by finite
// differences, and bad input.
#include "tardelli/ops/moe_dispatch.h"

#include <gtest/gtest.h>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::test::error_of;
using td::test::same_bytes;

namespace {

Tensor experts(const std::vector<int64_t>& v, int64_t T, int64_t K) {
  return from_vector<int64_t>(v, {T, K});
}

}  // namespace

// 4 tokens, top-2, 3 experts. Expert 0 gets (t0,k0) (t2,k1) (t3,k0); expert 1 gets (t1,k1)
// (t2,k0); expert 2 gets (t0,k1) (t1,k0) (t3,k1): rows in that order.
TEST(MoEDispatch, RowsByExpertThenToken) {
  MoEDispatch d = moe_dispatch(experts({0, 2, 2, 1, 1, 0, 0, 2}, 4, 2), 3);
  EXPECT_EQ(d.routed_per_expert, (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(d.tokens_per_expert, (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(d.dropped, 0);
  EXPECT_EQ(d.num_rows(), 8);
  EXPECT_EQ(to_vector<int64_t>(d.token_of_row), (std::vector<int64_t>{0, 2, 3, 1, 2, 0, 1, 3}));
  EXPECT_EQ(to_vector<int64_t>(d.slot_of_row), (std::vector<int64_t>{0, 5, 6, 3, 4, 1, 2, 7}));
}

// Capacity 2: expert 0 keeps t0 and t2 and drops t3's slot, expert 2 keeps t0 and t1 and drops
// t3's: 2 dropped, and token 3 has no row left.
TEST(MoEDispatch, CapacityDropsInTokenOrder) {
  MoEDispatch d = moe_dispatch(experts({0, 2, 2, 1, 1, 0, 0, 2}, 4, 2), 3, /*capacity=*/2);
  EXPECT_EQ(d.routed_per_expert, (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(d.tokens_per_expert, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(d.dropped, 2);
  EXPECT_EQ(to_vector<int64_t>(d.token_of_row), (std::vector<int64_t>{0, 2, 1, 2, 0, 1}));
  // Token 3's output is zeros; the others are their kept rows times the gates.
  Tensor x = td::test::randn_seeded({4, 5}, 1);
  Tensor gates = full({4, 2}, 0.5);
  std::vector<float> y = to_vector<float>(moe_unpermute(moe_permute(x, d), gates, d));
  std::vector<float> xv = to_vector<float>(x);
  for (int64_t c = 0; c < 5; ++c) {
    EXPECT_EQ(y[3 * 5 + c], 0.0f);
    for (int64_t t = 0; t < 3; ++t) EXPECT_FLOAT_EQ(y[t * 5 + c], xv[t * 5 + c]);  // 2 x 0.5
  }
  // Capacity 0 keeps nothing.
  MoEDispatch none = moe_dispatch(experts({0, 1}, 1, 2), 2, 0);
  EXPECT_EQ(none.num_rows(), 0);
  EXPECT_EQ(none.dropped, 2);
  EXPECT_TRUE(same_bytes(moe_unpermute(moe_permute(x.narrow(0, 0, 1), none), Tensor(), none),
                         zeros({1, 5})));
}

TEST(MoEDispatch, CapacityFormula) {
  EXPECT_EQ(moe_capacity(1.0, 10, 2, 4), 5);   // ceil(5)
  EXPECT_EQ(moe_capacity(1.25, 10, 2, 4), 7);  // ceil(6.25)
  EXPECT_EQ(moe_capacity(0.1, 3, 1, 8), 1);    // ceil(0.0375)
  EXPECT_NE(error_of([] { moe_capacity(0.0, 10, 2, 4); }).find("capacity_factor must be > 0"),
            std::string::npos);
}

// Permute then unpermute with unit gates returns x times its number of kept slots: exactly x for
// top-1, exactly 2x for top-2 (x + x is exact), in fp32 and bf16.
TEST(MoEDispatch, RoundTripIsExact) {
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor x = td::test::randn_seeded({6, 7}, 2, dt);
    MoEDispatch d1 = moe_dispatch(experts({3, 0, 1, 3, 2, 0}, 6, 1), 4);
    EXPECT_TRUE(same_bytes(moe_unpermute(moe_permute(x, d1), Tensor(), d1), x));
    EXPECT_TRUE(same_bytes(moe_unpermute(moe_permute(x, d1), ones({6, 1}), d1), x));
    MoEDispatch d2 = moe_dispatch(experts({3, 0, 1, 0, 2, 3, 3, 1, 0, 2, 1, 2}, 6, 2), 4);
    EXPECT_TRUE(same_bytes(moe_unpermute(moe_permute(x, d2), Tensor(), d2), add(x, x)));
  }
}

// The combine against a loop over tokens and slots.
TEST(MoEDispatch, UnpermuteWeighsRowsByGates) {
  const int64_t T = 5, K = 2, E = 3, D = 4;
  const std::vector<int64_t> idx = {2, 0, 1, 2, 0, 1, 2, 1, 0, 2};
  MoEDispatch d = moe_dispatch(experts(idx, T, K), E);
  Tensor rows = td::test::randn_seeded({d.num_rows(), D}, 3);
  Tensor gates = td::test::randn_seeded({T, K}, 4);
  std::vector<float> y = to_vector<float>(moe_unpermute(rows, gates, d));
  std::vector<float> rv = to_vector<float>(rows), gv = to_vector<float>(gates);
  std::vector<int64_t> slot = to_vector<int64_t>(d.slot_of_row);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < D; ++c) {
      double want = 0;
      for (int64_t k = 0; k < K; ++k) {
        const auto r = std::find(slot.begin(), slot.end(), t * K + k) - slot.begin();
        want += static_cast<double>(gv[t * K + k]) * rv[r * D + c];
      }
      EXPECT_NEAR(y[t * D + c], want, 1e-6) << t << "," << c;
    }
  }
}

TEST(MoEDispatch, Gradcheck) {
  MoEDispatch d = moe_dispatch(experts({2, 0, 1, 2, 0, 1, 2, 1}, 4, 2), 3, /*capacity=*/2);
  Tensor x = td::test::leaf({4, 3}, 5), gates = td::test::leaf({4, 2}, 6);
  auto r = autograd::gradcheck(
      [&d](const TensorList& in) { return moe_unpermute(moe_permute(in[0], d), in[1], d); },
      {x, gates});
  EXPECT_TRUE(r.ok) << r.message;
  // A dropped slot's gate gets a zero gradient (slot (3, 0): expert 2's third token).
  gates.set_grad(Tensor());
  moe_unpermute(moe_permute(x, d), gates, d).backward(ones({4, 3}));
  EXPECT_EQ(to_vector<float>(gates.grad())[6], 0.0f);
}

TEST(MoEDispatch, BadInputsNameTheValues) {
  EXPECT_NE(error_of([] {
              moe_dispatch(experts({0, 4}, 1, 2), 4);
            }).find("expert index 4 (token 0, slot 1) is out of range for 4 experts"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { moe_dispatch(experts({0}, 1, 1), 0); }).find("num_experts must be >= 1, got 0"),
      std::string::npos);
  MoEDispatch d = moe_dispatch(experts({0, 1}, 2, 1), 2);
  EXPECT_NE(error_of([&] {
              moe_permute(randn({3, 4}), d);
            }).find("input must be [2, features]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              moe_unpermute(randn({2, 4}), randn({2, 2}), d);
            }).find("gates must be [2, 1]"),
            std::string::npos);
}
