#include <gtest/gtest.h>

#include "tardelli/tardelli.h"

using namespace td;

namespace {
std::vector<float> v(const Tensor& t) {
  return to_vector<float>(t);
}
}  // namespace

// A value used twice gets the sum of both paths' gradients (diamond graph): y = (x*2) * (x+1)
// -> dy/dx = 2(x+1) + 2x = 4x + 2.
TEST(Engine, DiamondSumsPaths) {
  Tensor x = from_vector<float>({1, -2, 3}, {3}).set_requires_grad(true);
  Tensor y = sum(mul(mul(x, 2.0), add(x, 1.0)));
  y.backward();
  EXPECT_EQ(v(x.grad()), (std::vector<float>{6, -6, 14}));
}

// Gradient sums that may run in place (Note [In-place gradient accumulation]) never write into a
// tensor something else still holds. d = a + u hands one gradient tensor to a's slot and to u's
// node (u = 5 w), and runs before e = a * 3 (the newer node runs first: Note [Engine]); a's
// slot then receives e's gradient, and summing that into the shared tensor would reach w's
// gradient through u's node, which runs last. a + a puts one tensor into one slot twice. The
// residual-stream pattern (h = x + f(x), used again) sums in place and stays exact.
TEST(Engine, GradientSumsDoNotClobberSharedTensors) {
  Tensor a = from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  Tensor w = from_vector<float>({3, 4}, {2}).set_requires_grad(true);
  Tensor u = mul(w, 5.0);
  Tensor e = mul(a, 3.0);
  Tensor d = add(a, u);
  sum(mul(add(d, e), 2.0)).backward();  // mul: a contiguous gradient (sum's is an expand)
  EXPECT_EQ(v(a.grad()), (std::vector<float>{8, 8}));
  EXPECT_EQ(v(w.grad()), (std::vector<float>{10, 10}));
  Tensor c = from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  sum(mul(add(c, c), 1.5)).backward();
  EXPECT_EQ(v(c.grad()), (std::vector<float>{3, 3}));
  Tensor x = from_vector<float>({0.5f, -1, 2}, {3}).set_requires_grad(true);
  Tensor h = x;
  for (int i = 0; i < 3; ++i) h = add(h, mul(h, 0.5));  // d h / d h_prev = 1.5 per layer
  sum(mul(h, 2.0)).backward();
  EXPECT_EQ(v(x.grad()), (std::vector<float>{6.75f, 6.75f, 6.75f}));  // 2 * 1.5^3
}

// .grad accumulates across backward calls; retain_graph allows running the same graph again.
TEST(Engine, AccumulationAndRetainGraph) {
  Tensor x = from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  EXPECT_EQ(v(x.grad()), (std::vector<float>{2, 4}));
  y.backward();
  EXPECT_EQ(v(x.grad()), (std::vector<float>{4, 8}));
  // The graph was freed by the second call: a third is a clear error.
  EXPECT_THROW(y.backward(), Error);
}

TEST(Engine, NoGradRecordsNothing) {
  Tensor x = ones({2}).set_requires_grad(true);
  Tensor y;
  {
    autograd::NoGradGuard g;
    y = mul(x, 3.0);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_THROW(sum(y).backward(), Error);
  Tensor z = mul(x, 3.0);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_FALSE(z.is_leaf());
  EXPECT_EQ(z.grad_fn()->name(), "MulBackward");
}

TEST(Engine, DetachCutsHistory) {
  Tensor x = ones({3}).set_requires_grad(true);
  Tensor d = mul(x, 2.0).detach();
  EXPECT_FALSE(d.requires_grad());
  Tensor y = sum(mul(x, d));  // d treated as a constant 2
  y.backward();
  EXPECT_EQ(v(x.grad()), (std::vector<float>{2, 2, 2}));
}

// Hooks see the incoming gradient and may replace it; on non-leaves they act before the
// gradient flows further; post-accumulate hooks run after .grad is updated.
TEST(Engine, Hooks) {
  Tensor x = from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  Tensor h = mul(x, 3.0);
  std::vector<float> seen;
  h.register_hook([&](const Tensor& g) -> std::optional<Tensor> {
    seen = v(g);
    return mul(g, 10.0);
  });
  int post_calls = 0;
  std::vector<float> grad_at_post;
  x.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    ++post_calls;
    grad_at_post = v(leaf.grad());
  });
  x.register_hook([](const Tensor& g) -> std::optional<Tensor> { return add(g, 1.0); });
  sum(h).backward();
  EXPECT_EQ(seen, (std::vector<float>{1, 1}));
  // d/dx = 3 * (hook: *10) = 30, then the leaf hook adds 1.
  EXPECT_EQ(v(x.grad()), (std::vector<float>{31, 31}));
  EXPECT_EQ(post_calls, 1);
  EXPECT_EQ(grad_at_post, (std::vector<float>{31, 31}));
}

TEST(Engine, RetainGradOnNonLeaf) {
  Tensor x = from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  Tensor h = mul(x, x);
  h.retain_grad();
  sum(mul(h, 2.0)).backward();
  EXPECT_EQ(v(h.grad()), (std::vector<float>{2, 2}));
  EXPECT_EQ(v(x.grad()), (std::vector<float>{4, 8}));
}

// autograd::grad returns gradients without touching .grad, and create_graph gives
// differentiable gradients: d/dx (d/dx x^3) = 6x.
TEST(Engine, GradAndSecondOrder) {
  Tensor x = from_vector<float>({2}, {1}).set_requires_grad(true);
  Tensor y = sum(pow(x, 3.0));
  TensorList g = autograd::grad({y}, {x}, {}, /*retain_graph=*/false, /*create_graph=*/true);
  EXPECT_FLOAT_EQ(g[0].item<float>(), 12.0f);
  EXPECT_FALSE(x.grad().defined());
  sum(g[0]).backward();
  EXPECT_FLOAT_EQ(x.grad().item<float>(), 12.0f);
}

TEST(Engine, Errors) {
  Tensor x = ones({2, 2}).set_requires_grad(true);
  EXPECT_THROW(mul(x, 2.0).backward(), Error);  // non-scalar needs a gradient
  EXPECT_THROW(mul(x, 2.0).backward(ones({3})), Error);
  EXPECT_THROW(ones({2}, {DType::Int64}).set_requires_grad(true), Error);
  Tensor w = ones({2}).set_requires_grad(true);
  EXPECT_THROW(add_(w, ones({2})), Error);  // in-place on a grad-requiring leaf
  autograd::NoGradGuard g;
  EXPECT_NO_THROW(add_(w, ones({2})));
}

// A long chain frees each node's saved tensors as soon as it has run (no retain_graph), so
// peak memory in backward does not grow with depth beyond the forward's activations.
TEST(Engine, ReleasesSavedTensors) {
  Tensor x = randn({1 << 16}).set_requires_grad(true);
  Tensor h = x;
  for (int i = 0; i < 20; ++i) h = tanh(h);
  Tensor y = sum(h);
  std::weak_ptr<TensorImpl> mid = h.impl_ptr();
  h = Tensor();
  int64_t before = memory_stats().current_bytes;
  y.backward();
  // All 20 saved outputs (256 KiB each) are gone after backward; x.grad (256 KiB) is new.
  EXPECT_LE(memory_stats().current_bytes, before - 19 * (1 << 18));
}

// Note [Engine]: a leaf's gradient is accumulated as soon as it is complete, not after the rest
// of backward, also when the leaf's AccumulateGrad node is older than every op node: it is
// made on the leaf's first use and reused while any graph still refers to it, as the previous
// iteration's loss does in a training loop (`loss = model(x)` replaces it only after the new
// forward). Two layers h1 = tanh(x w1), y = sum(tanh(h1 w2)): w2's gradient must land before
// h1's gradient flows on into layer 1, in the first and in the second iteration alike.
TEST(Engine, LeafGradientsAccumulateAsSoonAsComplete) {
  Tensor x = randn({4, 8});
  Tensor w1 = randn({8, 8}).set_requires_grad(true);
  Tensor w2 = randn({8, 8}).set_requires_grad(true);
  std::vector<std::string> order;
  w2.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("w2"); });
  w1.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("w1"); });
  Tensor loss;
  for (int it = 0; it < 2; ++it) {
    order.clear();
    Tensor h1 = tanh(matmul(x, w1));
    h1.register_hook([&](const Tensor&) -> std::optional<Tensor> {
      order.push_back("h1");
      return std::nullopt;
    });
    Tensor next = sum(tanh(matmul(h1, w2)));  // the previous loss (and graph) is still alive
    loss = next;
    loss.backward();
    EXPECT_EQ(order, (std::vector<std::string>{"w2", "h1", "w1"})) << "iteration " << it;
  }
}
