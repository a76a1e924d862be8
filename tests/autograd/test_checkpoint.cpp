// Activation checkpointing (include/tardelli/autograd/checkpoint.h, Note [Checkpoint]):
// recomputing a function in backward must give exactly (bitwise, fp32) the gradients of running
// it directly, dropout included, and keep only the function's inputs between forward and
// backward.
#include <gtest/gtest.h>

#include "tardelli/autograd/weight_grad_store.h"
#include "tardelli/tardelli.h"

using namespace td;

namespace {

std::vector<float> v(const Tensor& t) {
  return to_vector<float>(t);
}

// One residual block with dropout: x + dropout(linear(tanh(linear(x, W1, b1)), W2, b2)).
struct Block {
  Tensor w1, b1, w2, b2;
  TensorList params() const { return {w1, b1, w2, b2}; }
};

Block make_block(uint64_t seed, int64_t d, int64_t hidden) {
  Generator gen(seed);
  Block b;
  b.w1 = mul(randn({hidden, d}, {}, &gen), 0.3).set_requires_grad(true);
  b.b1 = randn({hidden}, {}, &gen).set_requires_grad(true);
  b.w2 = mul(randn({d, hidden}, {}, &gen), 0.3).set_requires_grad(true);
  b.b2 = randn({d}, {}, &gen).set_requires_grad(true);
  return b;
}

Block copy_block(const Block& m) {
  auto c = [](const Tensor& t) { return t.detach().clone().set_requires_grad(true); };
  return {c(m.w1), c(m.b1), c(m.w2), c(m.b2)};
}

Tensor run_block(const Block& b, const Tensor& x, Generator* drop) {
  Tensor h = tanh(linear(x, b.w1, b.b1));
  return add(x, dropout(linear(h, b.w2, b.b2), 0.25, true, drop));
}

// The loss of `n` blocks (each checkpointed or not) and the input's leaf, after backward.
struct ChainRun {
  std::vector<Block> blocks;
  Tensor x, loss;
  uint64_t gen_offset = 0;
};

enum class Mode { Plain, Checkpoint, CheckpointDeferred };

ChainRun run_chain(const std::vector<Block>& init, Mode mode, const Tensor& x0,
                   uint64_t drop_seed) {
  ChainRun r;
  for (const Block& b : init) r.blocks.push_back(copy_block(b));
  r.x = x0.clone().set_requires_grad(true);
  Generator drop(drop_seed, 7);
  Tensor x = r.x;
  for (const Block& b : r.blocks) {
    if (mode == Mode::Plain) {
      x = run_block(b, x, &drop);
    } else {
      x = autograd::checkpoint(
          [&b, &drop](const TensorList& in) { return TensorList{run_block(b, in[0], &drop)}; }, {x},
          {{&drop}})[0];
    }
  }
  r.loss = sum(mul(x, x));
  if (mode == Mode::CheckpointDeferred) {
    autograd::DeferredWeightGrads w = autograd::backward_input({r.loss}, {});
    EXPECT_GT(w.size(), 0u);  // the recomputed GEMMs deferred their dW
    w.run();
  } else {
    r.loss.backward();
  }
  r.gen_offset = drop.offset();
  return r;
}

void expect_same_grads(const ChainRun& a, const ChainRun& b) {
  EXPECT_EQ(v(a.loss), v(b.loss));
  EXPECT_EQ(v(a.x.grad()), v(b.x.grad()));
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    const TensorList pa = a.blocks[i].params(), pb = b.blocks[i].params();
    for (size_t j = 0; j < pa.size(); ++j) {
      ASSERT_TRUE(pb[j].grad().defined()) << "block " << i << " param " << j;
      EXPECT_EQ(v(pa[j].grad()), v(pb[j].grad())) << "block " << i << " param " << j;
    }
  }
}

}  // namespace

// Property: three checkpointed blocks with dropout p = 0.25 give the plain chain's loss, input
// gradient and every parameter gradient bit for bit (the masks are replayed from the saved
// generator state), and leave the dropout stream where the plain run leaves it.
TEST(AutogradCheckpoint, GradientsBitwiseEqualWithDropout) {
  std::vector<Block> blocks;
  for (uint64_t i = 0; i < 3; ++i) blocks.push_back(make_block(10 + i, 12, 20));
  Generator gen(3);
  Tensor x0 = randn({4, 5, 12}, {}, &gen);
  ChainRun plain = run_chain(blocks, Mode::Plain, x0, 99);
  ChainRun ckpt = run_chain(blocks, Mode::Checkpoint, x0, 99);
  expect_same_grads(plain, ckpt);
  EXPECT_EQ(plain.gen_offset, ckpt.gen_offset);
}

// Property: under backward_input (zero-bubble pipelines) the recomputed blocks defer their weight
// GEMMs; after running them the gradients are the plain backward's, bitwise.
TEST(AutogradCheckpoint, DeferredWeightGradients) {
  std::vector<Block> blocks;
  for (uint64_t i = 0; i < 2; ++i) blocks.push_back(make_block(20 + i, 8, 16));
  Generator gen(4);
  Tensor x0 = randn({6, 8}, {}, &gen);
  expect_same_grads(run_chain(blocks, Mode::Plain, x0, 5),
                    run_chain(blocks, Mode::CheckpointDeferred, x0, 5));
}

// Property: parameters used inside the function reach their .grad through AccumulateGrad, so a
// post-accumulate hook (what data-parallel buckets use) fires once per parameter and backward,
// seeing the final gradient; a second backward accumulates into .grad as usual.
TEST(AutogradCheckpoint, PostAccumulateHooksFire) {
  Block b = make_block(30, 6, 10);
  std::vector<int> fired(4, 0);
  const TensorList ps = b.params();
  for (size_t j = 0; j < ps.size(); ++j) {
    ps[j].register_post_accumulate_grad_hook([&fired, j](const Tensor& p) {
      EXPECT_TRUE(p.grad().defined());
      ++fired[j];
    });
  }
  Generator gen(5);
  Tensor x = randn({3, 6}, {}, &gen).set_requires_grad(true);
  Generator drop(1);
  auto fn = [&b, &drop](const TensorList& in) { return TensorList{run_block(b, in[0], &drop)}; };
  sum(autograd::checkpoint(fn, {x}, {{&drop}})[0]).backward();
  EXPECT_EQ(fired, std::vector<int>(4, 1));
  const std::vector<float> g1 = v(b.w1.grad());
  sum(autograd::checkpoint(fn, {x}, {{&drop}})[0]).backward();
  EXPECT_EQ(fired, std::vector<int>(4, 2));
  EXPECT_NE(v(b.w1.grad()), g1);  // accumulated (another dropout mask, another gradient)
}

// Property: only the inputs are kept. Eight checkpointed blocks whose intermediates are 16 times
// wider than their input hold, after forward, at most their inputs plus a small slack; without
// checkpointing the same chain holds at least one wide intermediate per block.
TEST(AutogradCheckpoint, KeepsOnlyInputs) {
  const int64_t rows = 256, d = 16, hidden = 256, L = 8;
  std::vector<Block> blocks;
  for (int64_t i = 0; i < L; ++i) blocks.push_back(make_block(40 + i, d, hidden));
  Generator gen(6);
  Tensor x0 = randn({rows, d}, {}, &gen);
  const int64_t act = rows * d * 4, wide = rows * hidden * 4;
  auto held = [&](bool ckpt) {
    Tensor x = x0.clone().set_requires_grad(true);
    const int64_t before = memory_stats().current_bytes;
    Generator drop(1);
    Tensor y = x;
    for (const Block& b : blocks) {
      auto fn = [&b, &drop](const TensorList& in) {
        return TensorList{run_block(b, in[0], &drop)};
      };
      y = ckpt ? autograd::checkpoint(fn, {y}, {{&drop}})[0] : fn({y})[0];
    }
    return memory_stats().current_bytes - before;
  };
  const int64_t with = held(true), without = held(false);
  // L inputs (the first is x itself, already counted before) + the output + alignment slack.
  EXPECT_LE(with, (L + 1) * act + 64 * 1024) << "checkpointed chain held " << with << " bytes";
  EXPECT_GE(without, L * wide) << "plain chain held " << without << " bytes";
}

// Property: without grad mode the function simply runs (no node, nothing saved), and a
// double backward through a checkpoint is refused with a clear error.
TEST(AutogradCheckpoint, NoGradAndCreateGraph) {
  Tensor x = full({3}, 2.0).set_requires_grad(true);
  auto fn = [](const TensorList& in) { return TensorList{mul(in[0], in[0])}; };
  {
    autograd::NoGradGuard ng;
    Tensor y = autograd::checkpoint(fn, {x})[0];
    EXPECT_FALSE(y.requires_grad());
  }
  Tensor y = sum(autograd::checkpoint(fn, {x})[0]);
  try {
    autograd::backward({y}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "expected a td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("double backward"), std::string::npos) << e.what();
  }
}

// Property: a recomputation that draws a different amount from a listed generator is an error
// naming the offsets, not silently different masks.
TEST(AutogradCheckpoint, ReplayMismatchIsAnError) {
  Generator drop(2);
  int calls = 0;
  auto fn = [&](const TensorList& in) {
    ++calls;
    Tensor t = calls == 1 ? in[0] : cat({in[0], in[0]}, 0);  // the second run draws twice
    dropout(t, 0.5, true, &drop);
    return TensorList{mul(in[0], 3.0)};
  };
  Tensor x = full({4}, 1.0).set_requires_grad(true);
  Tensor y = sum(autograd::checkpoint(fn, {x}, {{&drop}})[0]);
  try {
    y.backward();
    FAIL() << "expected a td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different amount of random numbers"), std::string::npos)
        << e.what();
  }
}
