// grouped_linear (ops/grouped_linear.h) must be the G linear calls it replaces, one per group of
// rows, in value and in every gradient (with and without the fused activation and the bias, with
// empty groups), pass a finite-difference gradcheck, defer its weight gradient like linear, and
// reject inconsistent shapes with messages naming the values.
#include "tardelli/ops/grouped_linear.h"

#include <gtest/gtest.h>

#include "tardelli/autograd/weight_grad_store.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::test::error_of;
using td::test::expect_close;
using td::test::leaf;

namespace {

struct Result {
  Tensor y, dx, dw, db;
};

// The reference: linear (or activation_linear) on each group's rows with its weight, joined.
Tensor per_group(const Tensor& x, const Tensor& w, const Tensor& b,
                 const std::vector<int64_t>& sizes, std::optional<MlpActivation> act) {
  TensorList outs;
  int64_t off = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const auto gi = static_cast<int64_t>(g);
    Tensor xg = x.narrow(0, off, sizes[g]);
    Tensor bg = b.defined() ? b.select(0, gi) : Tensor();
    outs.push_back(act ? activation_linear(xg, *act, w.select(0, gi), bg)
                       : linear(xg, w.select(0, gi), bg));
    off += sizes[g];
  }
  return cat(outs, 0);
}

Result run(bool grouped, const Tensor& x0, const Tensor& w0, const Tensor& b0,
           const std::vector<int64_t>& sizes, std::optional<MlpActivation> act, const Tensor& gy) {
  Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  Tensor b = b0.defined() ? b0.clone().set_requires_grad(true) : Tensor();
  Tensor y = grouped ? grouped_linear(x, w, b, sizes, act) : per_group(x, w, b, sizes, act);
  y.backward(gy);
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  expect_close(td::test::doubles(got), td::test::doubles(want), 1e-5, 1e-5, what);
}

}  // namespace

// Groups of 3, 0, 5 and 2 rows (an empty group in the middle), every activation, with and
// without a bias: the output and the input, weight and bias gradients equal the per-group
// reference; the empty group's weight and bias gradients are zeros.
TEST(GroupedLinear, EqualsPerGroupLinear) {
  const std::vector<int64_t> sizes = {3, 0, 5, 2};
  const int64_t N = 10, G = 4, in = 6, out = 5;
  const std::optional<MlpActivation> acts[] = {std::nullopt, MlpActivation::GeluTanh,
                                               MlpActivation::SwiGLU};
  for (const auto& act : acts) {
    for (bool bias : {true, false}) {
      const int64_t k = act == MlpActivation::SwiGLU ? 2 * in : in;
      Tensor x = td::test::randn_seeded({N, k}, 1);
      Tensor w = td::test::randn_seeded({G, out, in}, 2, 0.3);
      Tensor b = bias ? td::test::randn_seeded({G, out}, 3) : Tensor();
      Tensor gy = td::test::randn_seeded({N, out}, 4);
      Result got = run(true, x, w, b, sizes, act, gy), want = run(false, x, w, b, sizes, act, gy);
      const std::string what = std::string(act ? "act " : "no act ") + (bias ? "bias" : "no bias");
      expect_same(got.y, want.y, what + " y");
      expect_same(got.dx, want.dx, what + " dx");
      expect_same(got.dw, want.dw, what + " dw");
      EXPECT_TRUE(td::test::same_bytes(got.dw.select(0, 1), zeros({out, in}))) << what;
      if (bias) {
        expect_same(got.db, want.db, what + " db");
        EXPECT_TRUE(td::test::same_bytes(got.db.select(0, 1), zeros({out}))) << what;
      }
    }
  }
}

// One group holding every row is linear itself, bit for bit (the same GEMM on the same operands).
TEST(GroupedLinear, OneGroupIsLinearBitwise) {
  Tensor x = td::test::randn_seeded({7, 8}, 5), w = td::test::randn_seeded({1, 3, 8}, 6);
  Tensor b = td::test::randn_seeded({1, 3}, 7);
  EXPECT_TRUE(td::test::same_bytes(grouped_linear(x, w, b, {7}),
                                   linear(x, w.select(0, 0), b.select(0, 0))));
}

TEST(GroupedLinear, Gradcheck) {
  for (auto act :
       {std::optional<MlpActivation>{}, std::optional<MlpActivation>{MlpActivation::SwiGLU}}) {
    const int64_t k = act ? 8 : 4;
    Tensor x = leaf({5, k}, 11), w = leaf({3, 2, 4}, 12), b = leaf({3, 2}, 13);
    auto r = autograd::gradcheck(
        [act](const TensorList& in) {
          return grouped_linear(in[0], in[1], in[2], {2, 0, 3}, act);
        },
        {x, w, b});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// Under backward_input the weight gradient waits in the batch; running it gives the plain
// backward's gradient.
TEST(GroupedLinear, DefersWeightGradient) {
  Tensor x0 = td::test::randn_seeded({6, 4}, 21), w0 = td::test::randn_seeded({2, 3, 2}, 22);
  Tensor gy = td::test::randn_seeded({6, 3}, 23);
  Result want = run(true, x0, w0, Tensor(), {4, 2}, MlpActivation::SwiGLU, gy);
  Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  Tensor y = grouped_linear(x, w, Tensor(), {4, 2}, MlpActivation::SwiGLU);
  autograd::DeferredWeightGrads batch = autograd::backward_input({y}, {gy});
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(batch.size(), 1u);
  batch.run();
  EXPECT_TRUE(td::test::same_bytes(x.grad(), want.dx));
  EXPECT_TRUE(td::test::same_bytes(w.grad(), want.dw));
}

TEST(GroupedLinear, BadInputsNameTheValues) {
  Tensor x = randn({5, 4}), w = randn({2, 3, 4});
  EXPECT_NE(error_of([&] {
              grouped_linear(x, w, Tensor(), {2, 2});
            }).find("the group sizes sum to 4 rows but the input has 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              grouped_linear(x, w, Tensor(), {5});
            }).find("1 group sizes for a weight of 2 groups"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              grouped_linear(x, w, Tensor(), {6, -1});
            }).find("group 1 has negative size -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              grouped_linear(x, w, Tensor(), {3, 2}, MlpActivation::SwiGLU);
            }).find("expects 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              grouped_linear(x, w, randn({2, 4}), {3, 2});
            }).find("(expected [2, 3])"),
            std::string::npos);
}
