#include <gtest/gtest.h>

#include "tardelli/tardelli.h"

using namespace td;

// The checker accepts a correct gradient and rejects a wrong one (a function whose backward
// we deliberately break through a hook).
TEST(Gradcheck, DetectsWrongGradients) {
  Tensor x = randn({3, 4}).set_requires_grad(true);
  auto good = autograd::gradcheck([](const TensorList& in) { return mul(tanh(in[0]), in[0]); }, {x});
  EXPECT_TRUE(good.ok) << good.message;
  auto bad = autograd::gradcheck(
      [](const TensorList& in) {
        Tensor y = mul(in[0], in[0]);
        if (y.requires_grad()) {
          y.register_hook([](const Tensor& g) -> std::optional<Tensor> { return mul(g, 1.1); });
        }
        return y;
      },
      {x});
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.message.find("input 0"), std::string::npos);
}
