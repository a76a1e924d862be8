#include <gtest/gtest.h>

#include "tardelli/tardelli.h"

using namespace td;

namespace {
Tensor iota(const Shape& s) { return arange(0, static_cast<double>(numel_of(s)), 1, {DType::Float32}).view(s); }
}  // namespace

// Every view op is a view (shared storage) with the right element mapping, and its gradient
// routes each element back to where it came from: check with a unique weight per element.
TEST(View, GradientsRouteBack) {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
  };
  std::vector<Case> cases = {
      {"transpose", [](const Tensor& x) { return x.transpose(0, 2); }},
      {"permute", [](const Tensor& x) { return x.permute({1, 2, 0}); }},
      {"slice_step", [](const Tensor& x) { return x.slice(2, 1, 4, 2); }},
      {"narrow", [](const Tensor& x) { return x.narrow(1, 1, 2); }},
      {"select", [](const Tensor& x) { return x.select(1, -1); }},
      {"unsqueeze_expand",
       [](const Tensor& x) { return x.unsqueeze(1).expand({2, 5, 3, 4}); }},
      {"view", [](const Tensor& x) { return x.view({6, 4}); }},
      {"flatten", [](const Tensor& x) { return x.flatten(1); }},
      {"squeeze", [](const Tensor& x) { return x.narrow(0, 1, 1).squeeze(0); }},
  };
  for (auto& c : cases) {
    Tensor x = randn({2, 3, 4}).set_requires_grad(true);
    auto r = autograd::gradcheck([&](const TensorList& in) { return c.f(in[0]); }, {x});
    EXPECT_TRUE(r.ok) << c.name << ": " << r.message;
    Tensor y = c.f(x);
    EXPECT_TRUE(y.shares_storage(x)) << c.name;
  }
}

TEST(View, ElementMapping) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(to_vector<float>(x.slice(2, 1, 4, 2)),
            (std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
  EXPECT_EQ(to_vector<float>(x.select(0, 1).select(0, 2)), (std::vector<float>{20, 21, 22, 23}));
  EXPECT_EQ(to_vector<float>(x.permute({2, 0, 1}).select(0, 0)),
            (std::vector<float>{0, 4, 8, 12, 16, 20}));
  Tensor e = from_vector<float>({1, 2}, {2, 1}).expand({2, 3});
  EXPECT_EQ(e.stride(1), 0);
  EXPECT_EQ(to_vector<float>(e), (std::vector<float>{1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(x.view({-1, 4}).sizes(), (Shape{6, 4}));
}

TEST(View, BadArgumentsAreErrors) {
  Tensor x = iota({2, 3});
  EXPECT_THROW(x.transpose(0, 2), Error);
  EXPECT_THROW(x.permute({0, 0}), Error);
  EXPECT_THROW(x.view({-1, -1}), Error);
  EXPECT_THROW(x.narrow(1, 2, 2), Error);
  EXPECT_THROW(x.select(0, 2), Error);
  EXPECT_THROW(x.expand({3, 3}), Error);
  EXPECT_THROW(x.slice(0, 0, 1, 0), Error);
  EXPECT_THROW(as_strided(x, {10}, {1}, 0), Error);
}

// reshape of a non-viewable layout copies (and stays differentiable); view refuses.
TEST(View, ReshapeCopiesWhenNeeded) {
  Tensor x = randn({3, 4}).set_requires_grad(true);
  Tensor r = x.transpose(0, 1).reshape({12});
  EXPECT_FALSE(r.shares_storage(x));
  auto res = autograd::gradcheck(
      [](const TensorList& in) { return in[0].transpose(0, 1).flatten(); }, {x});
  EXPECT_TRUE(res.ok) << res.message;
}
