// Vocabulary-parallel embedding and cross-entropy (include/tardelli/parallel/vocab_parallel.h)
// at 2 and 4 ranks, tp = the world.
//
// Every rank draws the same full tables / logits from one seed, slices its vocabulary range,
// and compares the parallel results with the dense ops (td::embedding, td::cross_entropy) run on
// the same rank. The vocabulary V = 1000 is padded (padded_vocab_size(1000, tp) = 1024 with the
// default multiple 128), so the last rank owns padding columns; their logits are set to a large
// value (30) that would change the loss if they were not masked.
//
// Tolerances: the embedding is bitwise (each output row is one table row plus exact zeros, and
// each table-row gradient is the same index-ordered scatter-add). The loss is computed in fp32
// with partial sums of exp all-reduced (re-associated) against the dense op's own fp32 sums:
// 1e-5 relative for losses (magnitude ~ log V ~ 7) and 1e-6 absolute for the softmax gradients
// (entries in [-1, 1], most ~ 1/V).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/core/error.h"
#include "tardelli/distributed/communicator.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/embedding.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/loss.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/parallel/tensor_parallel.h"
#include "tardelli/parallel/vocab_parallel.h"

namespace td::parallel {
namespace {

using distributed::CommPtr;

CommPtr tp_group() {
  static CommPtr w = distributed::mpi_world();
  return w;
}

Tensor full_randn(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, {}, &g), scale);
}

Tensor leaf(const Tensor& t) {
  return t.detach().clone().set_requires_grad(true);
}

void expect_near_all(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  std::vector<float> g = to_vector<float>(got), w = to_vector<float>(want);
  for (size_t i = 0; i < g.size(); ++i) {
    if (tol == 0.0) {
      ASSERT_EQ(g[i], w[i]) << what << " at flat index " << i << " (bitwise)";
    } else {
      ASSERT_NEAR(g[i], w[i], tol) << what << " at flat index " << i;
    }
  }
}

// Targets in [0, V) with every `ignore_every`-th token ignored; identical on every rank.
Tensor make_targets(int64_t n, int64_t V, uint64_t seed, int64_t ignore_every) {
  Generator g(seed);
  std::vector<int64_t> t = to_vector<int64_t>(randint(0, V, {n}, {DType::Int64}, &g));
  t[0] = V - 1;  // the last real id: next to the padding
  t[1] = 0;
  for (int64_t i = 2; i < n; i += ignore_every) t[i] = -100;
  return from_vector(t, {n});
}

// The padded full logits [N, V_pad]: the dense logits, then padding columns of value 30.
Tensor padded_logits(const Tensor& dense, int64_t padded) {
  const int64_t N = dense.size(0), V = dense.size(1);
  Tensor p = full({N, padded}, 30.0);
  p.narrow(1, 0, V).copy_(dense);
  return p;
}

struct CeCase {
  int64_t V;
  int64_t multiple;
  Reduction reduction;
};

// The vocab-parallel loss and the gradient of every rank's logit shard equal the dense
// cross_entropy and the matching columns of its gradient (zeros on padding columns), including
// ignored tokens, a vocabulary that is not a multiple of tp, and ranks that own only padding;
// both with the host loops and with the tensor ops a GPU runs (Note [Vocab-parallel head on a
// device], taken here on CPU tensors), to the same tolerances.
void check_cross_entropy(const CeCase& c, bool tensor_ops) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  const int64_t N = 13, padded = padded_vocab_size(c.V, n, c.multiple);
  const VocabRange range = vocab_range(padded, r, n);
  Tensor logits = full_randn({N, c.V}, 41, 3.0);
  Tensor targets = make_targets(N, c.V, 42, 4);
  // Per-token weights make the None reduction's incoming gradient non-uniform.
  Tensor wts = c.reduction == Reduction::None ? full_randn({N}, 43) : ones({});

  Tensor ld = leaf(logits);
  Tensor lossd = cross_entropy(ld, targets, -100, c.reduction);
  sum(mul(lossd, wts)).backward();

  Tensor shard = leaf(shard_cols(padded_logits(logits, padded), r, n));
  Tensor loss = vocab_parallel_cross_entropy(shard, targets, tp, range.start, c.V, -100,
                                             c.reduction, tensor_ops);
  sum(mul(loss, wts)).backward();

  const std::string tag = "V=" + std::to_string(c.V) + " padded=" + std::to_string(padded) +
                          (tensor_ops ? " (tensor ops) " : " ");
  double scale = 1.0;
  for (float v : to_vector<float>(lossd))
    scale = std::max(scale, static_cast<double>(std::fabs(v)));
  expect_near_all(loss, lossd.detach(), 1e-5 * scale, tag + "loss");
  Tensor want = zeros({N, range.size()});
  const int64_t hi = std::min(range.end, c.V);
  if (hi > range.start)
    want.narrow(1, 0, hi - range.start).copy_(ld.grad().narrow(1, range.start, hi - range.start));
  expect_near_all(shard.grad(), want, 1e-6, tag + "d logits shard");
}

void check_cross_entropy(const CeCase& c) {
  for (bool tensor_ops : {false, true}) check_cross_entropy(c, tensor_ops);
}

TEST(VocabParallel, CrossEntropyMeanMatchesDensePaddedVocab) {
  check_cross_entropy({1000, 128, Reduction::Mean});  // 1024 columns, 24 padding
}
TEST(VocabParallel, CrossEntropyPerTokenMatchesDense) {
  check_cross_entropy({1000, 128, Reduction::None});
}
TEST(VocabParallel, CrossEntropySumUnpaddedMatchesDense) {
  check_cross_entropy({1000, 1, Reduction::Sum});  // 1000 splits 2 and 4 ways: no padding
}
TEST(VocabParallel, CrossEntropyRanksWithOnlyPadding) {
  check_cross_entropy({10, 8, Reduction::Mean});  // 10 -> 16 (tp 2) or 32 (tp 4) columns
}

// All tokens ignored: Mean is 0/0 = NaN like td::cross_entropy, and the gradient is zero.
TEST(VocabParallel, CrossEntropyAllIgnored) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  const int64_t padded = padded_vocab_size(100, n, 8);
  Tensor shard = leaf(full_randn({3, padded / n}, 5));
  Tensor t = full({3}, -100, {DType::Int64});
  Tensor loss = vocab_parallel_cross_entropy(shard, t, tp, vocab_range(padded, r, n).start, 100);
  loss.backward();
  EXPECT_TRUE(std::isnan(loss.item<float>()));
  EXPECT_EQ(max(abs(shard.grad())).item<float>(), 0.0f);
}

// Bad input raises td::Error on every rank alike, before any collective.
TEST(VocabParallel, CrossEntropyBadInputRaises) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  const int64_t padded = padded_vocab_size(1000, n);
  const int64_t start = vocab_range(padded, r, n).start;
  Tensor shard = full_randn({4, padded / n}, 6);
  Tensor good = from_vector<int64_t>({1, 2, 3, 4}, {4});
  Tensor beyond = from_vector<int64_t>({1, 2, 1000, 4}, {4});  // a padding id
  EXPECT_THROW(vocab_parallel_cross_entropy(shard, beyond, tp, start, 1000), Error);
  EXPECT_THROW(
      vocab_parallel_cross_entropy(shard, from_vector<int64_t>({1, 2}, {2}), tp, start, 1000),
      Error);
  EXPECT_THROW(vocab_parallel_cross_entropy(shard, good, tp, start + 1, 1000), Error);
  EXPECT_THROW(vocab_parallel_cross_entropy(shard, good, tp, start, padded + 1), Error);
  EXPECT_THROW(vocab_parallel_cross_entropy(shard, good.to(DType::Float32), tp, start, 1000),
               Error);
}

// padded_vocab_size rounds up to a multiple of multiple * tp (Megatron's rule).
TEST(VocabParallel, PaddedVocabSize) {
  EXPECT_EQ(padded_vocab_size(1000, 4), 1024);
  EXPECT_EQ(padded_vocab_size(50257, 1), 50304);
  EXPECT_EQ(padded_vocab_size(50257, 2), 50432);
  EXPECT_EQ(padded_vocab_size(1024, 8), 1024);
  EXPECT_EQ(padded_vocab_size(1001, 4, 1), 1004);
  EXPECT_THROW(padded_vocab_size(0, 2), Error);
  EXPECT_THROW(padded_vocab_size(10, 0), Error);
  VocabRange v = vocab_range(1024, 3, 4);
  EXPECT_EQ(v.start, 768);
  EXPECT_EQ(v.end, 1024);
  EXPECT_THROW(vocab_range(1000, 0, 3), Error);
}

// The vocab-parallel embedding equals the dense lookup, and each rank's table-shard gradient the
// matching rows of the dense gradient (zeros for padding rows); under sequence parallelism the
// output is this rank's chunk of dim 0. Ids include repeats, 0 and V-1.
void check_embedding(bool sequence_parallel) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  const int64_t V = 1000, h = 8, s = 8, b = 2, padded = padded_vocab_size(V, n);
  const VocabRange range = vocab_range(padded, r, n);
  Tensor W = full_randn({V, h}, 51);
  Generator g(52);
  std::vector<int64_t> idv = to_vector<int64_t>(randint(0, V, {s * b}, {DType::Int64}, &g));
  idv[0] = 0;
  idv[1] = V - 1;
  idv[2] = idv[5];
  Tensor ids = from_vector(idv, {s, b});
  Tensor G = full_randn({s, b, h}, 53);

  Tensor Wd = leaf(W);
  Tensor yd = embedding(Wd, ids);
  sum(mul(yd, G)).backward();

  Tensor Ws = leaf(shard_vocab_rows(W, padded, r, n));
  Tensor y = vocab_parallel_embedding(ids, Ws, tp, range.start, sequence_parallel);
  sum(mul(y, sequence_parallel ? shard_rows(G, r, n) : G)).backward();

  const std::string tag = sequence_parallel ? "sequence-parallel " : "";
  expect_near_all(y, sequence_parallel ? shard_rows(yd, r, n) : yd.detach(), 0.0, tag + "y");
  expect_near_all(Ws.grad(), shard_vocab_rows(Wd.grad(), padded, r, n), 0.0, tag + "dW shard");
}

TEST(VocabParallel, EmbeddingMatchesDense) {
  check_embedding(false);
}
TEST(VocabParallel, EmbeddingSequenceParallelMatchesDense) {
  check_embedding(true);
}

// shard_vocab_rows pads with zero rows; out-of-range ids raise td::Error.
TEST(VocabParallel, EmbeddingShardAndBadIds) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  Tensor W = full_randn({10, 3}, 7);
  const int64_t padded = padded_vocab_size(10, n, 4);
  Tensor last = shard_vocab_rows(W, padded, n - 1, n);
  EXPECT_EQ(last.size(0), padded / n);
  EXPECT_EQ(max(abs(last.narrow(0, last.size(0) - 1, 1))).item<float>(), 0.0f);  // padding
  Tensor Ws = shard_vocab_rows(W, padded, r, n);
  const int64_t start = vocab_range(padded, r, n).start;
  EXPECT_THROW(vocab_parallel_embedding(from_vector<int64_t>({0, padded}, {2}), Ws, tp, start),
               Error);
  EXPECT_THROW(vocab_parallel_embedding(from_vector<int64_t>({-1}, {1}), Ws, tp, start), Error);
  EXPECT_THROW(vocab_parallel_embedding(full({2}, 1.0), Ws, tp, start), Error);
}

}  // namespace
}  // namespace td::parallel

namespace td::parallel {
namespace {

// The fused, token-chunked head + loss equals the unfused column-parallel logits followed by
// vocab_parallel_cross_entropy (Mean), in the loss and in the gradients of h and of the weight
// shard, whatever the chunking: chunk_elems is set so that 37 rows go in chunks of 5 rows (and
// a last chunk of 2), with ignored tokens and a padded vocabulary. The chunked path sums the same
// fp32 per-token losses in another grouping, so the tolerance is the re-association bound of
// the file header (1e-5 relative on the loss, 1e-6 absolute on gradients of magnitude <= 1).
// The fused head's inputs on this rank: h [37, 16] (the same on every rank), this rank's shard of
// a [1000, 16] table padded over tp, targets with ignored tokens; drawn from seed, seed + 1 and
// seed + 2. Chunks of 5 rows (`chunk`) leave a last chunk of 2.
struct HeadCase {
  static constexpr int64_t V = 1000, d = 16, n = 37;
  Tensor h_full, w_shard, targets;
  VocabRange r;
  int64_t chunk = 0;
};

HeadCase head_case(const CommPtr& tp, uint64_t seed) {
  HeadCase c;
  const int64_t vpad = padded_vocab_size(HeadCase::V, tp->size());
  c.r = vocab_range(vpad, tp->rank(), tp->size());
  c.w_shard = shard_vocab_rows(full_randn({HeadCase::V, HeadCase::d}, seed, 0.2), vpad, tp->rank(),
                               tp->size());
  c.h_full = full_randn({HeadCase::n, HeadCase::d}, seed + 1);
  c.targets = make_targets(HeadCase::n, HeadCase::V, seed + 2, 4);
  c.chunk = 5 * c.r.size();
  return c;
}

TEST(VocabParallel, LinearCrossEntropyChunkedMatchesUnfused) {
  const CommPtr tp = tp_group();
  const HeadCase c = head_case(tp, 11);
  const int64_t V = HeadCase::V;
  const VocabRange r = c.r;
  const Tensor h_full = c.h_full, targets = c.targets;
  Tensor w1 = leaf(c.w_shard);
  Tensor h1 = leaf(h_full);
  Tensor want = vocab_parallel_cross_entropy(linear(h1, w1), targets, tp, r.start, V);
  want.backward();
  Tensor w2 = leaf(w1), h2 = leaf(h_full);
  Tensor got = vocab_parallel_linear_cross_entropy(h2, w2, targets, tp, r.start, V, -100,
                                                   /*chunk_elems=*/c.chunk);
  got.backward();
  EXPECT_NEAR(got.item<float>(), want.item<float>(), 1e-5 * std::abs(want.item<float>()));
  expect_near_all(h2.grad(), h1.grad(), 1e-6, "d h (this rank's partial sum)");
  expect_near_all(w2.grad(), w1.grad(), 1e-6, "d w_shard");
  // The gradients are formed in the forward and scaled in backward: a retained graph run twice
  // accumulates exactly twice the first run's gradients (and runs no collective in backward).
  Tensor h3 = leaf(h_full), w3 = leaf(w1);
  Tensor twice = vocab_parallel_linear_cross_entropy(h3, w3, targets, tp, r.start, V);
  twice.backward(Tensor(), /*retain_graph=*/true);
  std::vector<float> first = to_vector<float>(h3.grad());
  twice.backward();
  std::vector<float> second = to_vector<float>(h3.grad());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(second[i], 2.0f * first[i]) << i;
  EXPECT_THROW(vocab_parallel_linear_cross_entropy(h2, w2, targets.narrow(0, 0, 5), tp, r.start, V),
               Error);
}

// Note [Vocab-parallel head on a device]: the tensor-ops path (what runs on a GPU), taken here on
// CPU tensors, gives the host-loop path's loss and gradients (the same chunking, ignored tokens,
// padded vocabulary): the row sums and the softmax are formed by other loops in other orders,
// so the tolerance is again the re-association bound (1e-5 relative, 1e-6 absolute).
TEST(VocabParallel, LinearCrossEntropyTensorOpsMatchHostLoops) {
  const CommPtr tp = tp_group();
  const HeadCase c = head_case(tp, 21);
  const int64_t V = HeadCase::V;
  Tensor h1 = leaf(c.h_full), w1 = leaf(c.w_shard), h2 = leaf(c.h_full), w2 = leaf(c.w_shard);
  Tensor loops = vocab_parallel_linear_cross_entropy(h1, w1, c.targets, tp, c.r.start, V, -100,
                                                     c.chunk, /*tensor_ops=*/false);
  Tensor ops = vocab_parallel_linear_cross_entropy(h2, w2, c.targets, tp, c.r.start, V, -100,
                                                   c.chunk, /*tensor_ops=*/true);
  loops.backward();
  ops.backward();
  EXPECT_NEAR(ops.item<float>(), loops.item<float>(), 1e-5 * std::abs(loops.item<float>()));
  expect_near_all(h2.grad(), h1.grad(), 1e-6, "d h (tensor ops)");
  expect_near_all(w2.grad(), w1.grad(), 1e-6, "d w_shard (tensor ops)");
  // Without a gradient (evaluation) the path gives the same loss.
  autograd::NoGradGuard no_grad;
  Tensor eval = vocab_parallel_linear_cross_entropy(c.h_full, c.w_shard, c.targets, tp, c.r.start,
                                                    V, -100, c.chunk, /*tensor_ops=*/true);
  EXPECT_NEAR(eval.item<float>(), loops.item<float>(), 1e-5 * std::abs(loops.item<float>()));
}

}  // namespace
}  // namespace td::parallel
