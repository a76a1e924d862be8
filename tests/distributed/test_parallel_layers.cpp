// Tensor-parallel modules (include/tardelli/parallel/layers.h) at 2 and 4 ranks, tp = the world.
//
// Each layer is built from a generator in the same state as the unsplit nn::Linear /
// nn::Embedding it must equal (Note [Layout-independent init]), on every rank; the rank also
// runs the unsplit module itself, so every parallel value is compared with the logical model's
// value on the same rank. The loss is sum(y * G) for a fixed G; for an output split over tp
// (columns, or the sequence under sequence parallelism) each rank takes its part of G, so the
// gradients of the shards must equal the matching slices of the unsplit module's gradients.
// Inputs are [4, 8, features]: dims 0 and 1 both divide by 2 and 4, so sequence parallelism is
// checked along seq_dim 0 (Megatron's [s, b, h]) and seq_dim 1 (the GPT's [b, s, h]).
//
// Tolerances. Bitwise where the parallel value is the very same computation as the unsplit one:
// the column-parallel output (each output column is one dot product over the full input, which
// the GEMM computes identically for a subset of the columns at the shapes used, Note [Bitwise
// column output]; a gather only concatenates), its
// bias gradient (a per-column sum over the same tokens), the row-parallel bias gradient without
// sequence parallelism (the same per-column sum of G), and the embedding (each output row is one
// table row plus exact zeros; each table row's gradient the same index-ordered sum). Otherwise
// kRel = 1e-5 of the largest magnitude: all-reduced partial sums and GEMMs that block a shard's
// shape differently re-associate fp32 sums of <= 32 products of O(1) terms, whose rounding is
// ~32 * 6e-8 = 2e-6 relative at worst, so 1e-5 has a 5x margin while a wrong slice, a missing
// reduction or a double-counted bias (errors of O(1)) fails by orders of magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/nn/embedding.h"
#include "tardelli/nn/linear.h"
#include "tardelli/ops/activation.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/loss.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/parallel/layers.h"
#include "tardelli/parallel/tensor_parallel.h"
#include "tardelli/parallel/vocab_parallel.h"

#include "distributed/parallel_test_util.h"
#include "test_util.h"

namespace td::parallel {
namespace {

using namespace td::parallel_test;

using distributed::CommPtr;
using test::error_of;
using test::randn_seeded;

constexpr double kRel = 1e-5;
constexpr int64_t kD0 = 4, kD1 = 8;  // the two leading dims of every input

CommPtr tp_group() {
  static CommPtr w = distributed::mpi_world();
  return w;
}

// This rank's chunk of dim `dim` (the split of sequence parallelism and of column shards).
Tensor chunk(const Tensor& t, int64_t dim, const CommPtr& tp) {
  const int64_t k = t.size(dim) / tp->size();
  return t.detach().narrow(dim, tp->rank() * k, k).contiguous();
}

void expect_error_naming(const std::string& msg, const std::string& name, const std::string& what) {
  EXPECT_NE(msg.find(name), std::string::npos)
      << what << ": expected a td::Error naming " << name << ", got '" << msg << "'";
}

// Output and gradients of one parallel run.
struct Result {
  Tensor y, dx, dw, db;
};

// ---- ColumnParallelLinear ----

// Note [Bitwise column output]: out = 8 keeps the full GEMM (N = 8) and the shards' (N = 4, 2)
// on oneDNN kernels that compute each output column as the same FMA chain over `in`, so the
// output is bitwise equal. That is a property of the kernels, not a guarantee: measured here, a
// full N = 16 against an N = 8 shard differs by 1 ulp in some columns (another blocking). The
// MLP test below uses such shapes and the kRel tolerance.
constexpr int64_t kColIn = 12, kColOut = 8;

Result run_column(const ColumnParallelOptions& o, uint64_t seed, const Tensor& x, const Tensor& G) {
  CommPtr tp = tp_group();
  Generator gen(seed);
  auto layer = std::make_shared<ColumnParallelLinear>(kColIn, kColOut, tp, o, &gen);
  Tensor xp = leaf(o.sequence_parallel ? chunk(x, o.seq_dim, tp) : x);
  Tensor y = layer->forward(xp);
  sum(mul(y, o.gather_output ? G : chunk(G, 2, tp))).backward();
  return {y.detach(), xp.grad(), layer->weight.grad(), layer->bias.grad()};
}

// Forward and every gradient equal nn::Linear built from the same generator state, with
// gather_output and with sequence parallelism along dims 0 and 1 (which also equals it off).
TEST(ParallelLayers, ColumnParallelLinearMatchesLinear) {
  CommPtr tp = tp_group();
  const uint64_t seed = 101;
  Tensor x = randn_seeded({kD0, kD1, kColIn}, 1), G = randn_seeded({kD0, kD1, kColOut}, 2);
  Generator gen(seed);
  nn::Linear dense(kColIn, kColOut, true, &gen);
  Tensor xd = leaf(x);
  Tensor yd = dense.forward(xd);
  sum(mul(yd, G)).backward();

  ColumnParallelOptions off;
  const Result base = run_column(off, seed, x, G);
  expect_close(base.y, chunk(yd, 2, tp), 0.0, "y");
  expect_close(base.dw, shard_rows(dense.weight.grad(), tp->rank(), tp->size()), kRel, "dW");
  expect_close(base.db, shard_rows(dense.bias.grad(), tp->rank(), tp->size()), 0.0, "db");
  expect_close(base.dx, xd.grad(), kRel, "dx");  // all-reduced partial products

  ColumnParallelOptions gather;
  gather.gather_output = true;
  const Result g = run_column(gather, seed, x, G);
  expect_close(g.y, yd.detach(), 0.0, "gather_output y");
  expect_close(g.dw, base.dw, 0.0, "gather_output dW");
  expect_close(g.db, base.db, 0.0, "gather_output db");
  expect_close(g.dx, xd.grad(), kRel, "gather_output dx");

  for (int64_t seq_dim : {0, 1}) {
    ColumnParallelOptions sp;
    sp.sequence_parallel = true;
    sp.seq_dim = seq_dim;
    const Result s = run_column(sp, seed, x, G);
    const std::string tag = "sequence_parallel seq_dim " + std::to_string(seq_dim) + " ";
    // The all-gathered input is the full input: the very same GEMMs as without it.
    expect_close(s.y, base.y, 0.0, tag + "y (== off)");
    expect_close(s.dw, base.dw, 0.0, tag + "dW (== off)");
    expect_close(s.db, base.db, 0.0, tag + "db (== off)");
    // Reduce-scattered instead of all-reduced: the same sums, possibly in another order.
    expect_close(s.dx, chunk(base.dx, seq_dim, tp), kRel, tag + "dx (== off)");
    expect_close(s.dx, chunk(xd.grad(), seq_dim, tp), kRel, tag + "dx");
  }
}

// ---- RowParallelLinear ----

constexpr int64_t kRowIn = 16, kRowOut = 12;

Result run_row(const RowParallelOptions& o, uint64_t seed, const Tensor& x, const Tensor& G) {
  CommPtr tp = tp_group();
  Generator gen(seed);
  auto layer = std::make_shared<RowParallelLinear>(kRowIn, kRowOut, tp, o, &gen);
  Tensor xp = leaf(o.input_is_parallel ? chunk(x, 2, tp) : x);
  Tensor y = layer->forward(xp);
  sum(mul(y, o.sequence_parallel ? chunk(G, o.seq_dim, tp) : G)).backward();
  return {y.detach(), xp.grad(), layer->weight.grad(), layer->bias.grad()};
}

// Forward and every gradient equal nn::Linear built from the same generator state, with the
// input split by the layer and with sequence parallelism along dims 0 and 1 (== it off).
TEST(ParallelLayers, RowParallelLinearMatchesLinear) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  const uint64_t seed = 202;
  Tensor x = randn_seeded({kD0, kD1, kRowIn}, 3), G = randn_seeded({kD0, kD1, kRowOut}, 4);
  Generator gen(seed);
  nn::Linear dense(kRowIn, kRowOut, true, &gen);
  Tensor xd = leaf(x);
  Tensor yd = dense.forward(xd);
  sum(mul(yd, G)).backward();

  RowParallelOptions parallel_in;
  const Result base = run_row(parallel_in, seed, x, G);
  expect_close(base.y, yd.detach(), kRel, "y");  // sum of per-rank partial products
  expect_close(base.dw, shard_cols(dense.weight.grad(), r, n), kRel, "dW");
  expect_close(base.db, dense.bias.grad(), 0.0, "db");
  expect_close(base.dx, chunk(xd.grad(), 2, tp), kRel, "dx");

  RowParallelOptions full_in;
  full_in.input_is_parallel = false;
  const Result f = run_row(full_in, seed, x, G);
  expect_close(f.y, yd.detach(), kRel, "split-input y");
  expect_close(f.dw, shard_cols(dense.weight.grad(), r, n), kRel, "split-input dW");
  expect_close(f.db, dense.bias.grad(), 0.0, "split-input db");
  expect_close(f.dx, xd.grad(), kRel, "split-input dx");  // all-gathered slices

  for (int64_t seq_dim : {0, 1}) {
    RowParallelOptions sp;
    sp.sequence_parallel = true;
    sp.seq_dim = seq_dim;
    const Result s = run_row(sp, seed, x, G);
    const std::string tag = "sequence_parallel seq_dim " + std::to_string(seq_dim) + " ";
    expect_close(s.y, chunk(base.y, seq_dim, tp), kRel, tag + "y (== off)");
    expect_close(s.y, chunk(yd, seq_dim, tp), kRel, tag + "y");
    expect_close(s.dw, base.dw, kRel, tag + "dW (== off)");
    expect_close(s.dx, base.dx, kRel, tag + "dx (== off)");
    // Each rank adds the bias to its own rows; the partial bias gradients are all-reduced.
    expect_close(s.db, dense.bias.grad(), kRel, tag + "db");
  }
}

// Column -> GELU -> row (an MLP block of modules) equals the unsplit MLP, with and without
// sequence parallelism.
TEST(ParallelLayers, MlpOfModulesMatchesDenseMlp) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  const int64_t h = 8, ffn = 16;
  Tensor x = randn_seeded({kD0, kD1, h}, 5), G = randn_seeded({kD0, kD1, h}, 6);
  Generator gd(303);
  nn::Linear fc1(h, ffn, true, &gd), fc2(ffn, h, true, &gd);
  Tensor xd = leaf(x);
  Tensor yd = fc2.forward(gelu(fc1.forward(xd)));
  sum(mul(yd, G)).backward();

  for (bool sp : {false, true}) {
    Generator gp(303);  // the same draws in the same order: fc1 then fc2
    ColumnParallelOptions co;
    co.sequence_parallel = sp;
    RowParallelOptions ro;
    ro.sequence_parallel = sp;
    auto c1 = std::make_shared<ColumnParallelLinear>(h, ffn, tp, co, &gp);
    auto c2 = std::make_shared<RowParallelLinear>(ffn, h, tp, ro, &gp);
    Tensor xp = leaf(sp ? chunk(x, 0, tp) : x);
    Tensor y = c2->forward(gelu(c1->forward(xp)));
    sum(mul(y, sp ? chunk(G, 0, tp) : G)).backward();
    const std::string tag = sp ? "sequence-parallel " : "";
    expect_close(y, sp ? chunk(yd, 0, tp) : yd.detach(), kRel, tag + "y");
    expect_close(xp.grad(), sp ? chunk(xd.grad(), 0, tp) : xd.grad(), kRel, tag + "dx");
    expect_close(c1->weight.grad(), shard_rows(fc1.weight.grad(), r, n), kRel, tag + "dW1");
    expect_close(c1->bias.grad(), shard_rows(fc1.bias.grad(), r, n), kRel, tag + "db1");
    expect_close(c2->weight.grad(), shard_cols(fc2.weight.grad(), r, n), kRel, tag + "dW2");
    expect_close(c2->bias.grad(), fc2.bias.grad(), kRel, tag + "db2");
  }
}

// Layout-independent init: the shards of all ranks tile exactly the weights nn::Linear draws
// from the same generator state; from_full gives the same shards; parameters are registered
// under torch's names with the shard shapes; the generator advances as nn::Linear's does.
TEST(ParallelLayers, LinearInitIsLayoutIndependent) {
  CommPtr tp = tp_group();
  const int n = tp->size();
  Generator gd(404), gc(404), gr(404);
  nn::Linear dense(kColIn, kColOut, true, &gd);
  auto col =
      std::make_shared<ColumnParallelLinear>(kColIn, kColOut, tp, ColumnParallelOptions{}, &gc);
  EXPECT_EQ(gc.offset(), gd.offset());
  auto row = std::make_shared<RowParallelLinear>(kColIn, kColOut, tp, RowParallelOptions{}, &gr);
  auto params = col->named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[0].second.sizes(), Shape({kColOut / n, kColIn}));
  EXPECT_EQ(params[1].first, "bias");
  EXPECT_EQ(params[1].second.sizes(), Shape({kColOut / n}));
  EXPECT_EQ(row->weight.sizes(), Shape({kColOut, kColIn / n}));
  EXPECT_EQ(row->bias.sizes(), Shape({kColOut}));
  EXPECT_TRUE(col->weight.requires_grad() && row->weight.requires_grad());
  EXPECT_TRUE(col->weight.is_leaf() && row->bias.is_leaf());
  EXPECT_TRUE(test::same_bytes(distributed::all_gather_along(col->weight, tp, 0), dense.weight));
  EXPECT_TRUE(test::same_bytes(distributed::all_gather_along(col->bias, tp, 0), dense.bias));
  EXPECT_TRUE(test::same_bytes(distributed::all_gather_along(row->weight, tp, 1), dense.weight));
  EXPECT_TRUE(test::same_bytes(row->bias, dense.bias));
  EXPECT_EQ(col->out_features(), kColOut);
  EXPECT_EQ(col->out_features_per_rank(), kColOut / n);
  EXPECT_EQ(row->in_features_per_rank(), kColIn / n);
  EXPECT_EQ(col->tp_size(), n);
  EXPECT_EQ(row->tp_rank(), tp->rank());

  auto col2 = ColumnParallelLinear::from_full(dense, tp);
  auto row2 = RowParallelLinear::from_full(dense, tp);
  EXPECT_TRUE(test::same_bytes(col2->weight, col->weight));
  EXPECT_TRUE(test::same_bytes(col2->bias, col->bias));
  EXPECT_TRUE(test::same_bytes(row2->weight, row->weight));
  // The shard is a copy: training it does not write into the unsplit layer.
  EXPECT_NE(col2->weight.data_ptr(), dense.weight.data_ptr());

  // Without bias (from the options, or from an unsplit layer without one).
  Generator g1(405), g2(405);
  nn::Linear nobias(kColIn, kColOut, false, &g1);
  ColumnParallelOptions ob;
  ob.bias = false;
  auto c3 = std::make_shared<ColumnParallelLinear>(kColIn, kColOut, tp, ob, &g2);
  EXPECT_FALSE(c3->has_bias());
  EXPECT_EQ(c3->named_parameters().size(), 1u);
  EXPECT_TRUE(test::same_bytes(c3->weight, shard_rows(nobias.weight, tp->rank(), n)));
  EXPECT_FALSE(RowParallelLinear::from_full(nobias, tp)->has_bias());
}

// ---- VocabParallelEmbedding ----

constexpr int64_t kDim = 8;

// ids [4, 8] in [0, V) with 0, V-1 and a repeated id.
Tensor make_ids(int64_t V, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> v = to_vector<int64_t>(randint(0, V, {kD0 * kD1}, {DType::Int64}, &g));
  v[0] = 0;
  v[1] = V - 1;
  v[2] = v[9];
  return from_vector(v, {kD0, kD1});
}

Result run_vocab(int64_t V, const VocabParallelOptions& o, uint64_t seed, const Tensor& ids,
                 const Tensor& G) {
  CommPtr tp = tp_group();
  Generator gen(seed);
  auto layer = std::make_shared<VocabParallelEmbedding>(V, kDim, tp, o, &gen);
  Tensor y = layer->forward(ids);
  sum(mul(y, o.sequence_parallel ? chunk(G, o.seq_dim, tp) : G)).backward();
  return {y.detach(), Tensor(), layer->weight.grad(), Tensor()};
}

// The embedding and its table-shard gradient equal nn::Embedding's from the same generator
// state, for a padded vocabulary (1000 -> 1024 with the default multiple 128) and one that is
// not a multiple of tp (1001 with make_divisible_by 1: 1002 at tp 2, 1004 at tp 4), with
// sequence parallelism along dims 0 and 1; the padding rows are zero and get zero gradient.
TEST(ParallelLayers, VocabParallelEmbeddingMatchesEmbedding) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  struct Case {
    int64_t V, multiple;
  };
  for (const Case c : {Case{1000, 128}, Case{1001, 1}}) {
    const uint64_t seed = 500 + static_cast<uint64_t>(c.V);
    Tensor ids = make_ids(c.V, 7), G = randn_seeded({kD0, kD1, kDim}, 8);
    Generator gd(seed);
    nn::Embedding dense(c.V, kDim, &gd);
    Tensor yd = dense.forward(ids);
    sum(mul(yd, G)).backward();

    const int64_t padded = padded_vocab_size(c.V, n, c.multiple);
    const std::string tag0 = "V=" + std::to_string(c.V) + " padded " + std::to_string(padded);
    ASSERT_NE(padded, c.V) << tag0 << ": the case must have padding";
    VocabParallelOptions o;
    o.make_divisible_by = c.multiple;
    Generator gp(seed);
    auto layer = std::make_shared<VocabParallelEmbedding>(c.V, kDim, tp, o, &gp);
    EXPECT_EQ(layer->padded_vocab(), padded) << tag0;
    EXPECT_EQ(layer->vocab_start(), r * padded / n) << tag0;
    EXPECT_EQ(layer->num_embeddings(), c.V) << tag0;
    EXPECT_EQ(layer->weight.sizes(), Shape({padded / n, kDim})) << tag0;
    // Layout-independent init, padding rows zero.
    EXPECT_TRUE(test::same_bytes(layer->weight, shard_vocab_rows(dense.weight, padded, r, n)))
        << tag0;
    EXPECT_TRUE(
        test::same_bytes(VocabParallelEmbedding::from_full(dense, tp, o)->weight, layer->weight))
        << tag0;

    const Result base = run_vocab(c.V, o, seed, ids, G);
    expect_close(base.y, yd.detach(), 0.0, tag0 + " y");
    // Padding rows: zero gradient (exactly), as the padded rows of the dense gradient.
    expect_close(base.dw, shard_vocab_rows(dense.weight.grad(), padded, r, n), 0.0, tag0 + " dW");
    for (int64_t seq_dim : {0, 1}) {
      VocabParallelOptions sp = o;
      sp.sequence_parallel = true;
      sp.seq_dim = seq_dim;
      const Result s = run_vocab(c.V, sp, seed, ids, G);
      const std::string tag = tag0 + " sequence_parallel seq_dim " + std::to_string(seq_dim);
      // A reduce-scatter of rows that are one table row plus exact zeros: exact.
      expect_close(s.y, chunk(base.y, seq_dim, tp), 0.0, tag + " y (== off)");
      expect_close(s.dw, base.dw, 0.0, tag + " dW (== off)");
    }
  }
}

// The embedding tied to the output projection with the vocab-parallel loss (a GPT's ends) equals
// nn::Embedding + linear + cross_entropy in the loss and the table gradient (lookup and
// projection paths together), for a padded vocabulary whose padding logits are 0: the padding
// never changes the loss and gets exactly zero gradient.
TEST(ParallelLayers, TiedEmbeddingAndVocabParallelLossMatchDense) {
  CommPtr tp = tp_group();
  const int r = tp->rank(), n = tp->size();
  const int64_t V = 1001;
  Tensor ids = make_ids(V, 9);
  std::vector<int64_t> tv = to_vector<int64_t>(make_ids(V, 10));
  for (size_t i = 3; i < tv.size(); i += 5) tv[i] = -100;  // some ignored tokens
  Tensor targets = from_vector(tv, {kD0 * kD1});

  Generator gd(606);
  nn::Embedding dense(V, kDim, &gd);
  Tensor hd = dense.forward(ids);
  Tensor lossd = cross_entropy(linear(hd, dense.weight).view({kD0 * kD1, V}), targets);
  lossd.backward();

  VocabParallelOptions o;
  o.make_divisible_by = 1;
  Generator gp(606);
  auto emb = std::make_shared<VocabParallelEmbedding>(V, kDim, tp, o, &gp);
  Tensor h = emb->forward(ids);
  Tensor logits = column_parallel_linear(h, emb->weight, Tensor(), tp);  // [4, 8, V_pad / tp]
  Tensor loss = vocab_parallel_cross_entropy(logits.view({kD0 * kD1, logits.size(-1)}), targets, tp,
                                             emb->vocab_start(), V);
  loss.backward();

  expect_close(loss, lossd.detach(), kRel, "loss");
  const int64_t padded = emb->padded_vocab();
  expect_close(emb->weight.grad(), shard_vocab_rows(dense.weight.grad(), padded, r, n), kRel,
               "dW (lookup + projection)");
  const int64_t real = std::clamp<int64_t>(V - emb->vocab_start(), 0, padded / n);
  if (real < padded / n) {
    Tensor pad_grad = emb->weight.grad().narrow(0, real, padded / n - real);
    EXPECT_EQ(max_abs(pad_grad), 0.0) << "padding rows got gradient";
  }
}

// ---- errors ----

// Bad layouts, options and inputs raise td::Errors that name the layer, on every rank alike
// and before any collective (so the ranks stay in step).
TEST(ParallelLayers, BadShapesAndOptionsRaiseNamingTheLayer) {
  CommPtr tp = tp_group();
  const int n = tp->size();
  const int64_t odd = 4 * n + 1;  // divisible by neither 2 nor 4
  Generator g(1);
  const std::string col = "ColumnParallelLinear", row = "RowParallelLinear",
                    voc = "VocabParallelEmbedding";
  // Divisibility.
  std::string msg = error_of([&] { ColumnParallelLinear(8, odd, tp, {}, &g); });
  expect_error_naming(msg, col, "out % tp");
  expect_error_naming(msg, "not divisible", "out % tp");
  expect_error_naming(error_of([&] { RowParallelLinear(odd, 8, tp, {}, &g); }), row, "in % tp");
  expect_error_naming(error_of([&] {
                        ColumnParallelLinear(full({odd, 4}, 1.0), Tensor(), tp);
                      }),
                      col, "from a full weight");
  // Option conflicts and a null group.
  ColumnParallelOptions gather_sp;
  gather_sp.gather_output = gather_sp.sequence_parallel = true;
  expect_error_naming(error_of([&] { ColumnParallelLinear(8, 8, tp, gather_sp, &g); }), col,
                      "gather_output + sequence_parallel");
  RowParallelOptions sp_full_in;
  sp_full_in.sequence_parallel = true;
  sp_full_in.input_is_parallel = false;
  expect_error_naming(error_of([&] { RowParallelLinear(8, 8, tp, sp_full_in, &g); }), row,
                      "sequence_parallel without input_is_parallel");
  expect_error_naming(error_of([&] { ColumnParallelLinear(8, 8, nullptr, {}, &g); }), col,
                      "null group");
  expect_error_naming(error_of([&] { VocabParallelEmbedding(0, 8, tp, {}, &g); }), voc,
                      "empty vocabulary");
  VocabParallelOptions bad_multiple;
  bad_multiple.make_divisible_by = 0;
  expect_error_naming(error_of([&] { VocabParallelEmbedding(10, 8, tp, bad_multiple, &g); }), voc,
                      "make_divisible_by 0");
  expect_error_naming(error_of([&] {
                        ColumnParallelLinear(full({8, 4}, 1.0), full({3}, 1.0), tp);
                      }),
                      col, "bias shape");

  // Inputs.
  auto c = std::make_shared<ColumnParallelLinear>(8, 4 * n, tp, ColumnParallelOptions{}, &g);
  expect_error_naming(error_of([&] { c->forward(full({2, 7}, 1.0)); }), col, "input features");
  auto rl = std::make_shared<RowParallelLinear>(4 * n, 8, tp, RowParallelOptions{}, &g);
  expect_error_naming(error_of([&] {
                        rl->forward(full({2, 4 * n}, 1.0));
                      }),
                      row, "full input with input_is_parallel");
  RowParallelOptions sp;
  sp.sequence_parallel = true;
  auto rs = std::make_shared<RowParallelLinear>(4 * n, 8, tp, sp, &g);
  expect_error_naming(error_of([&] {
                        rs->forward(full({n + 1, 4}, 1.0));
                      }),
                      row, "sequence not divisible by tp");
  sp.seq_dim = 1;
  auto rs1 = std::make_shared<RowParallelLinear>(4 * n, 8, tp, sp, &g);
  expect_error_naming(error_of([&] {
                        rs1->forward(full({n, 4}, 1.0));
                      }),
                      row, "seq_dim is the feature dim");
  VocabParallelOptions vo;
  vo.make_divisible_by = 1;
  auto e = std::make_shared<VocabParallelEmbedding>(10, 4, tp, vo, &g);
  // 10 is padded at tp 4 (to 12): id 10 is in the padding range, still out of range.
  expect_error_naming(error_of([&] {
                        e->forward(from_vector<int64_t>({0, 10}, {2}));
                      }),
                      voc, "id >= num_embeddings");
  expect_error_naming(error_of([&] { e->forward(from_vector<int64_t>({-1}, {1})); }), voc,
                      "negative id");
  expect_error_naming(error_of([&] { e->forward(full({2}, 1.0)); }), voc, "float ids");
  vo.sequence_parallel = true;
  auto es = std::make_shared<VocabParallelEmbedding>(10, 4, tp, vo, &g);
  expect_error_naming(error_of([&] {
                        es->forward(from_vector<int64_t>({1, 2, 3}, {3}));
                      }),
                      voc, "ids not divisible by tp under sequence parallelism");
  // The group still works: no rank entered a collective the others skipped.
  Tensor one = ones({1});
  tp->all_reduce(one);
  EXPECT_EQ(one.item<float>(), static_cast<float>(n));
}

}  // namespace
}  // namespace td::parallel
