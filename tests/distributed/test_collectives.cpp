// Autograd collectives (include/tardelli/distributed/collectives.h) at 2 and 4 ranks.
//
// Every rank can build every rank's inputs from (rank, seed), so forward values are compared
// with references computed locally, and gradients with the same computation done on ONE process
// with all ranks' data and the single-process autograd (cat, narrow, sum, mul): the "logical"
// model the parallel one splits. Conventions of that model (Megatron's): a replicated tensor is
// one logical tensor; rank-dependent loss weights w_r mean the ranks compute different things
// from it (their losses add up), shared weights w mean the ranks repeat one computation.
//
// Inputs and weights are multiples of 1/4 and 1/2 of magnitude <= 2, so every sum below is exact
// in float32 and bfloat16: results must match to rounding of exact values (tolerance 1e-6 of
// the magnitude). The losses are linear in each function's output (sum(y * w)); since every
// backward is linear in the incoming gradient and independent of the forward values, that
// exercises the whole backward map. The MLP test adds a non-linear chain in float32.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/core/error.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/activation.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/join.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/view.h"
#include "test_util.h"

namespace td::distributed {
namespace {

using td::test::error_of;

CommPtr world() {
  static CommPtr w = mpi_world();  // timeout: TD_COMM_TIMEOUT_S (ctest: 60 s)
  return w;
}

// A float32 tensor of `shape` whose values depend on (who, seed): multiples of 1/4 in [-1, 1]
// (scale 0.25) or of 1/2 in [-1.5, 1.5] (weights).
Tensor data(const Shape& shape, int who, int seed, double scale = 0.25) {
  std::vector<float> v(numel_of(shape));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] =
        static_cast<float>(((static_cast<int64_t>(i) * 7 + who * 13 + seed * 5) % 9 - 4) * scale);
  return from_vector(v, shape);
}
Tensor weights(const Shape& shape, int who, int seed) {
  Tensor w = data(shape, who, seed + 100, 0.5);
  return clamp(w, -1.5, 1.5);
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  std::vector<float> g = to_vector<float>(got), w = to_vector<float>(want);
  double scale = 1e-30;
  for (float x : w) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_NEAR(g[i], w[i], 1e-6 * scale + 1e-6) << what << " at flat index " << i;
  }
}

Shape with_dim(Shape s, int64_t d, int64_t v) {
  s[d] = v;
  return s;
}

// A function under test, its input/weight layout and its single-process reference.
struct Case {
  std::string name;
  bool x_replicated;      // every rank's input is the same logical tensor
  bool w_shared;          // the loss weights are the same on every rank
  bool x_chunk, y_chunk;  // input / output have the chunk shape (else the full shape)
  std::function<Tensor(const Tensor&, const CommPtr&, int64_t)> fn;
  // The logical loss from all ranks' leaves xs (one leaf if x_replicated) and weights ws.
  std::function<Tensor(const TensorList&, const TensorList&, int64_t, int)> reference;
};

Tensor narrow_chunk(const Tensor& y, int64_t d, int r, int n) {
  int64_t k = y.size(d) / n;
  return narrow(y, d, r * k, k);
}

std::vector<Case> cases() {
  auto sum_all = [](const TensorList& xs) {
    Tensor s = xs[0];
    for (size_t i = 1; i < xs.size(); ++i) s = add(s, xs[i]);
    return s;
  };
  std::vector<Case> c;
  c.push_back({"copy_to_region", true, false, false, false,
               [](const Tensor& x, const CommPtr& g, int64_t) { return copy_to_region(x, g); },
               [](const TensorList& xs, const TensorList& ws, int64_t, int n) {
                 Tensor l = sum(mul(xs[0], ws[0]));
                 for (int r = 1; r < n; ++r) l = add(l, sum(mul(xs[0], ws[r])));
                 return l;
               }});
  c.push_back({"reduce_from_region", false, true, false, false,
               [](const Tensor& x, const CommPtr& g, int64_t) { return reduce_from_region(x, g); },
               [sum_all](const TensorList& xs, const TensorList& ws, int64_t, int) {
                 return sum(mul(sum_all(xs), ws[0]));
               }});
  c.push_back(
      {"scatter_to_region", true, false, false, true,
       [](const Tensor& x, const CommPtr& g, int64_t d) { return scatter_to_region(x, g, d); },
       [](const TensorList& xs, const TensorList& ws, int64_t d, int n) {
         Tensor l = sum(mul(narrow_chunk(xs[0], d, 0, n), ws[0]));
         for (int r = 1; r < n; ++r) l = add(l, sum(mul(narrow_chunk(xs[0], d, r, n), ws[r])));
         return l;
       }});
  c.push_back(
      {"gather_from_region", false, true, true, false,
       [](const Tensor& x, const CommPtr& g, int64_t d) { return gather_from_region(x, g, d); },
       [](const TensorList& xs, const TensorList& ws, int64_t d, int) {
         return sum(mul(cat(xs, d), ws[0]));
       }});
  c.push_back({"reduce_scatter_to_sequence", false, false, false, true,
               [](const Tensor& x, const CommPtr& g, int64_t d) {
                 return reduce_scatter_to_sequence(x, g, d);
               },
               [sum_all](const TensorList& xs, const TensorList& ws, int64_t d, int n) {
                 Tensor y = sum_all(xs);
                 Tensor l = sum(mul(narrow_chunk(y, d, 0, n), ws[0]));
                 for (int r = 1; r < n; ++r) l = add(l, sum(mul(narrow_chunk(y, d, r, n), ws[r])));
                 return l;
               }});
  c.push_back({"gather_from_sequence", false, false, true, false,
               [](const Tensor& x, const CommPtr& g, int64_t d) {
                 return gather_from_sequence(x, g, d, true);
               },
               [](const TensorList& xs, const TensorList& ws, int64_t d, int n) {
                 Tensor y = cat(xs, d);
                 Tensor l = sum(mul(y, ws[0]));
                 for (int r = 1; r < n; ++r) l = add(l, sum(mul(y, ws[r])));
                 return l;
               }});
  c.push_back({"gather_from_sequence(tp_output_grad=false)", false, true, true, false,
               [](const Tensor& x, const CommPtr& g, int64_t d) {
                 return gather_from_sequence(x, g, d, false);
               },
               [](const TensorList& xs, const TensorList& ws, int64_t d, int) {
                 return sum(mul(cat(xs, d), ws[0]));
               }});
  return c;
}

// Property: for each function, dim (leading, inner, last as -1) and dtype (float32, bfloat16),
// the forward output equals the logical reference's value and each rank's input gradient equals
// that rank's slice of the logical model's gradient.
TEST(Collectives, ForwardAndBackwardMatchLogicalModel) {
  CommPtr g = world();
  const int n = g->size(), me = g->rank();
  const Shape full = {2 * n, 3 * n, 2 * n};
  for (DType dt : {DType::Float32, DType::BFloat16})
    for (const Case& c : cases())
      for (int64_t dim : {0, 1, -1}) {
        SCOPED_TRACE(c.name + " dim " + std::to_string(dim) + " " + dtype_name(dt));
        const int64_t d = dim < 0 ? dim + 3 : dim;
        const Shape chunk = with_dim(full, d, full[d] / n);
        const Shape xs_shape = c.x_chunk ? chunk : full, ws_shape = c.y_chunk ? chunk : full;
        auto x_of = [&](int r) { return data(xs_shape, c.x_replicated ? 0 : r, 1); };
        auto w_of = [&](int r) { return weights(ws_shape, c.w_shared ? 0 : r, 2); };

        // Distributed: this rank's part.
        Tensor x = x_of(me).to(dt).set_requires_grad(true);
        Tensor y = c.fn(x, g, dim);
        Tensor loss = sum(mul(y, w_of(me).to(dt)));
        loss.backward();
        EXPECT_TRUE(x.grad().defined());

        // Logical model on this process (float32; the data are exact in bfloat16).
        TensorList xs, ws;
        for (int r = 0; r < (c.x_replicated ? 1 : n); ++r)
          xs.push_back(x_of(r).to(dt).to(DType::Float32).set_requires_grad(true));
        for (int r = 0; r < (c.w_shared ? 1 : n); ++r)
          ws.push_back(w_of(r).to(dt).to(DType::Float32));
        Tensor ref_loss = c.reference(xs, ws, d, n);
        ref_loss.backward();
        expect_close(x.grad().to(DType::Float32), xs[c.x_replicated ? 0 : me].grad(),
                     "input gradient");

        // Forward values: the output against the logical output, recomputed without grad.
        autograd::NoGradGuard no_grad;
        TensorList plain;
        for (const Tensor& t : xs) plain.push_back(t.detach());
        Tensor want;
        if (c.name == "copy_to_region") {
          want = plain[0];
        } else if (c.name == "reduce_from_region" || c.name == "reduce_scatter_to_sequence") {
          want = plain[0];
          for (int r = 1; r < n; ++r) want = add(want, plain[r]);
          if (c.y_chunk) want = narrow_chunk(want, d, me, n);
        } else if (c.name == "scatter_to_region") {
          want = narrow_chunk(plain[0], d, me, n);
        } else {
          want = cat(plain, d);
        }
        EXPECT_EQ(y.dtype(), dt);
        expect_close(y.to(DType::Float32), want, "forward output");
      }
}

// Property: non-contiguous inputs (a transposed view) give the same results as their contiguous
// copies, for a gather along an inner dim and a scatter along the last dim.
TEST(Collectives, NonContiguousInputs) {
  CommPtr g = world();
  const int n = g->size(), me = g->rank();
  Tensor base = data({3, 2 * n}, me, 3);
  Tensor xt = transpose(base, 0, 1);  // [2n, 3], not contiguous
  ASSERT_FALSE(xt.is_contiguous());
  expect_close(gather_from_region(xt, g, 1), gather_from_region(xt.contiguous(), g, 1),
               "gather of a transposed view");
  Tensor rep = transpose(data({2 * n, 5}, 0, 4), 0, 1);  // replicated, [5, 2n]
  expect_close(scatter_to_region(rep, g, -1), narrow(rep, 1, me * 2, 2), "scatter of a view");
  expect_close(reduce_scatter_to_sequence(xt, g, 0),
               reduce_scatter_to_sequence(xt.contiguous(), g, 0), "reduce_scatter of a view");
}

// Property: Megatron's tensor-parallel MLP built from these functions reproduces the unsharded
// MLP (forward and all gradients) in float32, both in the plain form (copy -> column-parallel ->
// gelu -> row-parallel -> reduce) and the sequence-parallel form (gather_from_sequence ->
// column-parallel -> gelu -> row-parallel -> reduce_scatter_to_sequence). The tolerance covers
// float32 reassociation of the hidden-dim sums across ranks (~1e-6 relative).
TEST(Collectives, TensorParallelMlpMatchesUnsharded) {
  CommPtr g = world();
  const int n = g->size(), me = g->rank();
  const int64_t s = 2 * n, h = 6, f = 4 * n;  // sequence, hidden, ffn (split over ranks)
  Tensor x_full = data({s, h}, 0, 5);
  Tensor w1_full = data({h, f}, 0, 6), w2_full = data({f, h}, 0, 7);
  Tensor wout = weights({s, h}, 0, 8);
  for (bool sequence_parallel : {false, true}) {
    SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "tensor parallel");
    // Unsharded reference.
    Tensor X = x_full.clone().set_requires_grad(true);
    Tensor W1 = w1_full.clone().set_requires_grad(true),
           W2 = w2_full.clone().set_requires_grad(true);
    Tensor Y = mm(gelu(mm(X, W1)), W2);
    sum(mul(Y, wout)).backward();

    // Sharded: W1 by columns, W2 by rows; x replicated or split along the sequence.
    const int64_t k = f / n;
    Tensor w1 = narrow(w1_full, 1, me * k, k).contiguous().set_requires_grad(true);
    Tensor w2 = narrow(w2_full, 0, me * k, k).contiguous().set_requires_grad(true);
    Tensor x =
        (sequence_parallel ? narrow(x_full, 0, me * (s / n), s / n).contiguous() : x_full.clone())
            .set_requires_grad(true);
    Tensor in = sequence_parallel ? gather_from_sequence(x, g, 0) : copy_to_region(x, g);
    Tensor partial = mm(gelu(mm(in, w1)), w2);
    Tensor y = sequence_parallel ? reduce_scatter_to_sequence(partial, g, 0)
                                 : reduce_from_region(partial, g);
    Tensor wy = sequence_parallel ? narrow(wout, 0, me * (s / n), s / n) : wout;
    sum(mul(y, wy)).backward();

    auto close = [](const Tensor& a, const Tensor& b, const char* what) {
      std::vector<float> u = to_vector<float>(a), v = to_vector<float>(b);
      ASSERT_EQ(a.sizes(), b.sizes()) << what;
      for (size_t i = 0; i < u.size(); ++i)
        ASSERT_NEAR(u[i], v[i], 1e-5 * (1 + std::fabs(v[i]))) << what << " at " << i;
    };
    close(y, sequence_parallel ? narrow(Y.detach(), 0, me * (s / n), s / n) : Y.detach(), "output");
    close(x.grad(), sequence_parallel ? narrow(X.grad(), 0, me * (s / n), s / n) : X.grad(),
          "grad x");
    close(w1.grad(), narrow(W1.grad(), 1, me * k, k), "grad w1");
    close(w2.grad(), narrow(W2.grad(), 0, me * k, k), "grad w2");
  }
}

// Property: a group of one rank makes every function the identity (no node recorded).
TEST(Collectives, SingleRankGroupIsIdentity) {
  CommPtr g = world();
  CommPtr self = g->split(g->rank(), 0, "self");
  ASSERT_EQ(self->size(), 1);
  Tensor x = data({2, 4}, g->rank(), 9).set_requires_grad(true);
  for (const Case& c : cases()) {
    Tensor y = c.fn(x, self, -1);
    EXPECT_TRUE(y.is_same(x)) << c.name;
  }
}

// Property: bad arguments raise td::Error on every rank before any communication (so no rank
// is left waiting), naming the function, the shape and the group.
TEST(Collectives, BadInputRaises) {
  CommPtr g = world();
  Tensor x = data({5}, 0, 1);
  std::string msg = error_of([&] { scatter_to_region(x, g, 0); });
  EXPECT_NE(msg.find("scatter_to_region: size 5 of dim 0 of float32[5]"), std::string::npos) << msg;
  EXPECT_NE(
      msg.find("not divisible by the size " + std::to_string(g->size()) + " of group 'world'"),
      std::string::npos)
      << msg;
  msg = error_of([&] { reduce_scatter_to_sequence(x, g, 0); });
  EXPECT_NE(msg.find("reduce_scatter_to_sequence: size 5"), std::string::npos) << msg;
  msg = error_of([&] { gather_from_region(x, g, 1); });
  EXPECT_NE(msg.find("gather_from_region: dim 1 out of range for float32[5]"), std::string::npos)
      << msg;
  msg = error_of([&] { copy_to_region(x, nullptr); });
  EXPECT_NE(msg.find("copy_to_region: the communicator is null"), std::string::npos) << msg;
  msg = error_of([&] { reduce_from_region(Tensor(), g); });
  EXPECT_NE(msg.find("reduce_from_region: argument 'input' is an undefined tensor"),
            std::string::npos)
      << msg;
  msg = error_of([&] { gather_from_sequence(scalar_tensor(1.0), g); });
  EXPECT_NE(msg.find("expected a tensor with at least one dim"), std::string::npos) << msg;
}

}  // namespace
}  // namespace td::distributed
