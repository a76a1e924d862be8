// Tensor-parallel linear layers (include/tardelli/parallel/tensor_parallel.h) at 2 and 4 ranks,
// tp = the world.
//
// Every rank draws the same FULL weights from one seed and slices its shard (Note [Layout-
// independent init]); it also computes the dense (unsplit) layer itself with the single-process
// ops, so each parallel result is compared with the logical model's value on the same rank.
// The loss is sum(y * G) for a fixed G: for a replicated output every rank computes the one
// logical loss; for an output split over tp (columns, or rows under sequence parallelism) each
// rank's loss is its part of the logical loss (the parts add up), so in both cases the
// gradients of the parallel leaves must equal the matching slices of the dense gradients.
//
// Tolerances (fp32, inputs ~N(0,1), sums of <= 16 products): bitwise where a parallel value is
// the very same computation as the dense one (the column-parallel output: one dot product per
// output column over the full input, which oneDNN computes identically for a column subset;
// bias gradients without sequence parallelism); otherwise 1e-5 of the largest magnitude: sums
// split over ranks (all-reduced partial products) or GEMMs that oneDNN blocks differently for
// the shard's shape than for the full one (weight gradients).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/activation.h"
#include "tardelli/ops/dropout.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/parallel/rng_tracker.h"
#include "tardelli/parallel/tensor_parallel.h"

#include "distributed/parallel_test_util.h"

namespace td::parallel {
namespace {

using namespace td::parallel_test;

using distributed::CommPtr;

CommPtr tp_group() {
  static CommPtr w = distributed::mpi_world();  // tp = the whole world
  return w;
}

constexpr double kRel = 1e-5;

struct Dims {
  int64_t tokens = 8, in = 12, out = 8;  // all divisible by 4 (and 2)
};

// Column-parallel: forward and every gradient equal the dense layer's slices, with and without
// gather_output and sequence parallelism.
void check_column(bool gather_output, bool sequence_parallel) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  Dims d;
  Tensor x = full_randn({d.tokens, d.in}, 1), w = full_randn({d.out, d.in}, 2);
  Tensor b = full_randn({d.out}, 3), G = full_randn({d.tokens, d.out}, 4);

  Tensor xd = leaf(x), wd = leaf(w), bd = leaf(b);
  Tensor yd = linear(xd, wd, bd);
  sum(mul(yd, G)).backward();

  Tensor xp = leaf(sequence_parallel ? shard_rows(x, r, n) : x);
  Tensor ws = leaf(shard_rows(w, r, n)), bs = leaf(shard_rows(b, r, n));
  Tensor y = column_parallel_linear(xp, ws, bs, tp, gather_output, sequence_parallel);
  sum(mul(y, gather_output ? G : shard_cols(G, r, n))).backward();

  const std::string tag =
      std::string(gather_output ? "gather " : "") + (sequence_parallel ? "sequence-parallel " : "");
  // Each output column is the dense column's own dot product over the full input.
  expect_close(y, gather_output ? yd.detach() : shard_cols(yd, r, n), 0.0, tag + "y");
  // dW rows are the same dot products over tokens, but oneDNN blocks a [out/tp, in] gradient
  // GEMM differently from the [out, in] one, so they are re-associated.
  expect_close(ws.grad(), shard_rows(wd.grad(), r, n), kRel, tag + "dW shard");
  expect_close(bs.grad(), shard_rows(bd.grad(), r, n), 0.0, tag + "db shard");
  // The input gradient is all-reduced (or reduce-scattered) from per-rank partial products.
  expect_close(xp.grad(), sequence_parallel ? shard_rows(xd.grad(), r, n) : xd.grad(), kRel,
               tag + "dx");
}

TEST(TensorParallel, ColumnParallelMatchesDense) {
  check_column(false, false);
}
TEST(TensorParallel, ColumnParallelGatherOutputMatchesDense) {
  check_column(true, false);
}
TEST(TensorParallel, ColumnParallelSequenceParallelMatchesDense) {
  check_column(false, true);
}

// Row-parallel: forward and every gradient equal the dense layer's, with the input already
// split or split by the layer, and with sequence parallelism (output rows scattered).
void check_row(bool input_is_parallel, bool sequence_parallel) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  Dims d;
  Tensor x = full_randn({d.tokens, d.in}, 11), w = full_randn({d.out, d.in}, 12);
  Tensor b = full_randn({d.out}, 13), G = full_randn({d.tokens, d.out}, 14);

  Tensor xd = leaf(x), wd = leaf(w), bd = leaf(b);
  Tensor yd = linear(xd, wd, bd);
  sum(mul(yd, G)).backward();

  Tensor xp = leaf(input_is_parallel ? shard_cols(x, r, n) : x);
  Tensor ws = leaf(shard_cols(w, r, n)), bp = leaf(b);
  Tensor y = row_parallel_linear(xp, ws, bp, tp, input_is_parallel, sequence_parallel);
  sum(mul(y, sequence_parallel ? shard_rows(G, r, n) : G)).backward();

  const std::string tag = std::string(input_is_parallel ? "" : "split-input ") +
                          (sequence_parallel ? "sequence-parallel " : "");
  // The output sums per-rank partial products: re-associated.
  expect_close(y, sequence_parallel ? shard_rows(yd, r, n) : yd.detach(), kRel, tag + "y");
  // Each weight column's gradient and each input column's gradient is the dense one's own
  // computation (dW[:, k] = G^T x[:, k], dx[:, k] = G W[:, k]).
  expect_close(ws.grad(), shard_cols(wd.grad(), r, n), kRel, tag + "dW shard");
  expect_close(xp.grad(), input_is_parallel ? shard_cols(xd.grad(), r, n) : xd.grad(), kRel,
               tag + "dx");
  // The full bias gradient on every rank (under sequence parallelism: all-reduced partial sums).
  expect_close(bp.grad(), bd.grad(), sequence_parallel ? kRel : 0.0, tag + "db");
}

TEST(TensorParallel, RowParallelMatchesDense) {
  check_row(true, false);
}
TEST(TensorParallel, RowParallelSplitInputMatchesDense) {
  check_row(false, false);
}
TEST(TensorParallel, RowParallelSequenceParallelMatchesDense) {
  check_row(true, true);
}

// An MLP block, column-parallel fc1 -> GELU -> row-parallel fc2, equals the dense MLP in its
// output and every gradient, with and without sequence parallelism, on [s, b, h] inputs.
void check_mlp(bool sequence_parallel) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  const int64_t s = 8, bsz = 2, h = 8, ffn = 16;
  Tensor x = full_randn({s, bsz, h}, 21);
  Tensor w1 = full_randn({ffn, h}, 22), b1 = full_randn({ffn}, 23);
  Tensor w2 = mul(full_randn({h, ffn}, 24), 0.25), b2 = full_randn({h}, 25);
  Tensor G = full_randn({s, bsz, h}, 26);

  Tensor xd = leaf(x), w1d = leaf(w1), b1d = leaf(b1), w2d = leaf(w2), b2d = leaf(b2);
  Tensor yd = linear(gelu(linear(xd, w1d, b1d)), w2d, b2d);
  sum(mul(yd, G)).backward();

  Tensor xp = leaf(sequence_parallel ? shard_rows(x, r, n) : x);
  Tensor w1s = leaf(shard_rows(w1, r, n)), b1s = leaf(shard_rows(b1, r, n));
  Tensor w2s = leaf(shard_cols(w2, r, n)), b2p = leaf(b2);
  Tensor hidden = gelu(column_parallel_linear(xp, w1s, b1s, tp, false, sequence_parallel));
  Tensor y = row_parallel_linear(hidden, w2s, b2p, tp, true, sequence_parallel);
  sum(mul(y, sequence_parallel ? shard_rows(G, r, n) : G)).backward();

  const std::string tag = sequence_parallel ? "sequence-parallel " : "";
  expect_close(y, sequence_parallel ? shard_rows(yd, r, n) : yd.detach(), kRel, tag + "y");
  expect_close(xp.grad(), sequence_parallel ? shard_rows(xd.grad(), r, n) : xd.grad(), kRel,
               tag + "dx");
  expect_close(w1s.grad(), shard_rows(w1d.grad(), r, n), kRel, tag + "dW1 shard");
  expect_close(b1s.grad(), shard_rows(b1d.grad(), r, n), kRel, tag + "db1 shard");
  expect_close(w2s.grad(), shard_cols(w2d.grad(), r, n), kRel, tag + "dW2 shard");
  expect_close(b2p.grad(), b2d.grad(), kRel, tag + "db2");
}

TEST(TensorParallel, MlpBlockMatchesDense) {
  check_mlp(false);
}
TEST(TensorParallel, MlpBlockSequenceParallelMatchesDense) {
  check_mlp(true);
}

// Slicing helpers: the shards of all ranks tile the full tensor (a pure function; checked on
// this process for every rank of a 4-way split), and bad arguments raise td::Error.
TEST(TensorParallel, ShardHelpersTileTheFullTensor) {
  Tensor w = full_randn({8, 12}, 31);
  std::vector<float> full = to_vector<float>(w);
  for (int r = 0; r < 4; ++r) {
    std::vector<float> rows = to_vector<float>(shard_rows(w, r, 4));
    std::vector<float> cols = to_vector<float>(shard_cols(w, r, 4));
    ASSERT_EQ(rows.size(), 24u);
    ASSERT_EQ(cols.size(), 24u);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 12; ++j) EXPECT_EQ(rows[i * 12 + j], full[(r * 2 + i) * 12 + j]);
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(cols[i * 3 + j], full[i * 12 + r * 3 + j]);
  }
  EXPECT_THROW(shard_rows(w, 0, 3), Error);                    // 8 rows do not split 3 ways
  EXPECT_THROW(shard_cols(w, 4, 4), Error);                    // rank out of range
  EXPECT_THROW(shard_cols(full_randn({12}, 1), 0, 2), Error);  // not 2-D
}

// Bad arguments raise td::Error on every rank alike, before any collective.
TEST(TensorParallel, BadArgumentsRaise) {
  CommPtr tp = tp_group();
  Tensor x = full_randn({8, 12}, 1), w = full_randn({8, 12}, 2);
  EXPECT_THROW(column_parallel_linear(x, full_randn({2, 5}, 3), Tensor(), tp), Error);
  EXPECT_THROW(column_parallel_linear(x, w, full_randn({3}, 3), tp), Error);
  EXPECT_THROW(column_parallel_linear(x, w, Tensor(), tp, true, true), Error);
  EXPECT_THROW(row_parallel_linear(x, w, Tensor(), tp, false, true), Error);
  EXPECT_THROW(row_parallel_linear(x, full_randn({8, 5}, 3), Tensor(), tp), Error);
  EXPECT_THROW(column_parallel_linear(x, w, Tensor(), nullptr), Error);
}

// RngTracker::model_parallel(seed, tp_rank): the default stream draws the same numbers on every
// tp rank (replicated activations get one dropout mask) and the model-parallel stream different
// numbers on every rank (split activations get independent masks); dropout through fork()
// follows the same rule.
TEST(TensorParallel, RngTrackerStreamsAcrossRanks) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  RngTracker tracker = RngTracker::model_parallel(1234, r);
  const int64_t k = 64;
  Tensor mine = zeros({4, k});
  mine.select(0, 0).copy_(rand({k}, {}, &tracker.get(kDefaultRng)));
  mine.select(0, 1).copy_(rand({k}, {}, &tracker.get(kModelParallelRng)));
  mine.select(0, 2).copy_(dropout(ones({k}), 0.5, true, tracker.fork(kDefaultRng)));
  mine.select(0, 3).copy_(dropout(ones({k}), 0.5, true, tracker.fork(kModelParallelRng)));
  Tensor all = distributed::all_gather_along(mine.unsqueeze(0), tp, 0);  // [n, 4, k]
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      for (int row = 0; row < 4; ++row) {
        std::vector<float> va = to_vector<float>(all.select(0, a).select(0, row));
        std::vector<float> vb = to_vector<float>(all.select(0, b).select(0, row));
        if (row % 2 == 0) {
          EXPECT_EQ(va, vb) << "replicated stream, row " << row << ", ranks " << a << " " << b;
        } else {
          EXPECT_NE(va, vb) << "model-parallel stream, row " << row << ", ranks " << a << " " << b;
        }
      }
    }
  }
}

}  // namespace
}  // namespace td::parallel
