// matmul / mm / bmm / linear on CUDA (cuBLASLt) against the CPU backend: fp32 (TF32 off and
// on), bf16 and fp16 with fp32 accumulation, transposed / sliced / permuted / expanded operands,
// batch broadcasting, odd and empty sizes, gradients, and the errors of bad arguments.
//
// Note [GEMM tolerances]: the reference is the CPU product of the same operand values widened to
// fp32, so the only differences are
// - fp32, TF32 off: summation order. Each output sums K products of unit-variance values; two
//   fp32 orders differ by a few ulps of the partial sums, ~1e-7 * sqrt(K) in absolute terms.
//   atol = 2e-5 * sqrt(K) and rtol = 1e-5 leave a wide margin.
// - fp32, TF32 on: each operand is rounded to a 10-bit mantissa (relative error <= 2^-11), so
//   each product is off by up to ~1e-3 of itself; K independent such errors give ~1e-3 *
//   sqrt(K). atol = 5e-3 * sqrt(K) is about five standard deviations.
// - bf16 / fp16 outputs: the fp32 sum is rounded once to the output type, relative error <= 2^-8
//   (bf16, 8 significant bits) or 2^-11 (fp16, 11 bits). rtol = 2^-8 resp. 2^-10 (the bound,
//   resp. 2x margin) plus the fp32 atol above for the summation order.
// - bias / GELU epilogues with bf16 / fp16 outputs: on the H200 (2026-11-30) cuBLASLt's kernels
//   were seen to round the product p = x W^T to the output type before the epilogue adds the
//   bias, so the result is round(round(p) + b): off by up to half an ulp of p plus half an ulp
//   of the result, which is many ulps of the result where the bias cancels most of p. Such
//   outputs are checked elementwise against u (|p| + |want|) with u = the rtol above
//   (expect_epilogue_matches); a GELU output adds the slope of GELU (< 1.13) times that bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

std::vector<double> host(const Tensor& t) {
  return doubles(t.detach().to(kCPU));
}

struct Tol {
  double atol, rtol;
};

// See Note [GEMM tolerances]; K is the contraction length.
Tol tol_for(DType dt, int64_t K, bool tf32 = false) {
  const double sk = std::sqrt(static_cast<double>(std::max<int64_t>(K, 1)));
  switch (dt) {
    case DType::BFloat16:
      return {2e-5 * sk, 1.0 / 256};
    case DType::Float16:
      return {2e-5 * sk, 1.0 / 1024};
    default:
      return tf32 ? Tol{5e-3 * sk, 5e-3} : Tol{2e-5 * sk, 1e-5};
  }
}

// A CPU operand in dtype dt and the same values on the GPU.
struct Pair {
  Tensor cpu, cuda;
};
Pair operand(const Shape& s, uint64_t seed, DType dt) {
  Tensor c = randn_seeded(s, seed, dt);
  return {c, c.to(gpu())};
}

Tensor widened(const Tensor& t) {
  return t.to(DType::Float32);
}

// The GPU result `got` of an op against the CPU's fp32 result `want`.
void expect_matches(const Tensor& got, const Tensor& want, DType dt, int64_t K,
                    const std::string& what, bool tf32 = false) {
  ASSERT_TRUE(got.is_cuda()) << what;
  ASSERT_EQ(got.dtype(), dt) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const Tol t = tol_for(dt, K, tf32);
  expect_close(host(got), host(want), t.atol, t.rtol, what);
}

// Elementwise |got - want| <= atol + slope * u (|p| + |pre|) + u |want| for a result that went
// through an epilogue (Note [GEMM tolerances]): p is the product without the bias, pre the
// epilogue's input (p + b) and `want` the exact result (pre itself, or GELU of it: slope 1.13).
void expect_epilogue_close(const std::vector<double>& got, const std::vector<double>& want,
                           const std::vector<double>& p, const std::vector<double>& pre, DType dt,
                           double atol, double slope, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(p.size(), want.size()) << what;
  const double u = tol_for(dt, 1).rtol;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound =
        atol + slope * u * (std::fabs(p[i]) + std::fabs(pre[i])) + u * std::fabs(want[i]);
    ASSERT_NEAR(got[i], want[i], bound) << what << " element " << i << " (product " << p[i] << ")";
  }
}

// linear() with a bias on the GPU against the CPU's fp32 result; bf16/fp16 by the epilogue bound.
void expect_linear_matches(const Tensor& got, const Tensor& want, const Tensor& product, DType dt,
                           int64_t K, const std::string& what) {
  if (dt == DType::Float32) return expect_matches(got, want, dt, K, what);
  ASSERT_TRUE(got.is_cuda()) << what;
  ASSERT_EQ(got.dtype(), dt) << what;
  const std::vector<double> w = host(want);
  expect_epilogue_close(host(got), w, host(product), w, dt, tol_for(dt, K).atol, 1.0, what);
}

// Restores the TF32 switch when a test ends, pass or fail.
struct Tf32Scope {
  explicit Tf32Scope(bool on) : prev(matmul_allow_tf32()) { set_matmul_allow_tf32(on); }
  ~Tf32Scope() { set_matmul_allow_tf32(prev); }
  bool prev;
};

const DType kTypes[] = {DType::Float32, DType::BFloat16, DType::Float16};

}  // namespace

TEST(MatmulCuda, MmOddSizesFp32) {
  TD_REQUIRE_CUDA();
  Tf32Scope exact(false);
  const int64_t sizes[] = {1, 7, 127, 1000};
  uint64_t seed = 1;
  for (int64_t M : sizes) {
    for (int64_t N : sizes) {
      for (int64_t K : sizes) {
        Pair a = operand({M, K}, seed++, DType::Float32),
             b = operand({K, N}, seed++, DType::Float32);
        expect_matches(
            mm(a.cuda, b.cuda), mm(a.cpu, b.cpu), DType::Float32, K,
            "mm M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(MatmulCuda, MmReducedPrecisionAccumulatesInFp32) {
  TD_REQUIRE_CUDA();
  const int64_t shapes[][3] = {{1, 1, 1},    {7, 127, 1000}, {127, 7, 1},       {1000, 1, 127},
                               {1, 1000, 7}, {64, 64, 4096}, {1024, 1024, 1024}};
  uint64_t seed = 100;
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    for (const auto& s : shapes) {
      const int64_t M = s[0], N = s[1], K = s[2];
      Pair a = operand({M, K}, seed++, dt), b = operand({K, N}, seed++, dt);
      // K = 4096 of bf16 products: a bf16 (or split-k bf16) accumulation would be off by ~1e-1;
      // fp32 accumulation stays within the output rounding.
      expect_matches(mm(a.cuda, b.cuda), mm(widened(a.cpu), widened(b.cpu)), dt, K,
                     std::string(dtype_name(dt)) + " mm M=" + std::to_string(M) +
                         " N=" + std::to_string(N) + " K=" + std::to_string(K));
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(MatmulCuda, Tf32Switch) {
  TD_REQUIRE_CUDA();
  EXPECT_FALSE(matmul_allow_tf32()) << "TF32 must be off by default";
  Pair a = operand({300, 513}, 7, DType::Float32), b = operand({513, 257}, 8, DType::Float32);
  Tensor want = mm(a.cpu, b.cpu);
  {
    Tf32Scope on(true);
    EXPECT_TRUE(matmul_allow_tf32());
    expect_matches(mm(a.cuda, b.cuda), want, DType::Float32, 513, "tf32 on", /*tf32=*/true);
    expect_matches(linear(a.cuda, b.cuda.t()), want, DType::Float32, 513, "tf32 linear", true);
  }
  EXPECT_FALSE(matmul_allow_tf32());
  // Off again: the exact fp32 tolerance holds (a cached TF32 algorithm must not be reused).
  expect_matches(mm(a.cuda, b.cuda), want, DType::Float32, 513, "tf32 off again");
}

TEST(MatmulCuda, TransposedAndStridedOperands) {
  TD_REQUIRE_CUDA();
  Tf32Scope exact(false);
  const int64_t M = 37, K = 129, N = 65;
  uint64_t seed = 200;
  for (DType dt : kTypes) {
    const std::string name = dtype_name(dt);
    // Column-major views (transposes): passed to cuBLASLt as op = T, not copied.
    Pair at = operand({K, M}, seed++, dt), bt = operand({N, K}, seed++, dt);
    Tensor want = mm(widened(at.cpu).t(), widened(bt.cpu).t());
    expect_matches(mm(at.cuda.t(), bt.cuda.t()), want, dt, K, name + " A^T B^T");
    Pair a = operand({M, K}, seed++, dt), b = operand({K, N}, seed++, dt);
    expect_matches(mm(a.cuda, bt.cuda.t()), mm(widened(a.cpu), widened(bt.cpu).t()), dt, K,
                   name + " A B^T");
    expect_matches(mm(at.cuda.t(), b.cuda), mm(widened(at.cpu).t(), widened(b.cpu)), dt, K,
                   name + " A^T B");
    // Row slices with a leading dim larger than the row and an odd element offset (pointers
    // aligned to 2 or 4 bytes only).
    Pair wide_a = operand({M, K + 9}, seed++, dt), wide_b = operand({K + 3, N + 5}, seed++, dt);
    Tensor sa = wide_a.cuda.narrow(1, 3, K), sb = wide_b.cuda.narrow(0, 1, K).narrow(1, 1, N);
    expect_matches(mm(sa, sb),
                   mm(widened(wide_a.cpu).narrow(1, 3, K),
                      widened(wide_b.cpu).narrow(0, 1, K).narrow(1, 1, N)),
                   dt, K, name + " sliced");
    // Stepped columns (no unit stride): copied first.
    Pair step = operand({M, 2 * K}, seed++, dt);
    expect_matches(mm(step.cuda.slice(1, 0, 2 * K, 2), b.cuda),
                   mm(widened(step.cpu).slice(1, 0, 2 * K, 2), widened(b.cpu)), dt, K,
                   name + " stepped");
    // The input is unchanged by any of this.
    expect_close(host(a.cuda), doubles(a.cpu), 0, 0, name + " input untouched");
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(MatmulCuda, BmmAndBatchLayouts) {
  TD_REQUIRE_CUDA();
  Tf32Scope exact(false);
  const int64_t B = 5, M = 33, K = 70, N = 19;
  uint64_t seed = 300;
  for (DType dt : kTypes) {
    const std::string name = dtype_name(dt);
    Pair a = operand({B, M, K}, seed++, dt), b = operand({B, K, N}, seed++, dt);
    expect_matches(bmm(a.cuda, b.cuda), bmm(widened(a.cpu), widened(b.cpu)), dt, K, name + " bmm");
    // Batch stride smaller than the matrix (a permuted [M, B, K]): one strided-batch call.
    Pair p = operand({M, B, K}, seed++, dt);
    expect_matches(bmm(p.cuda.permute({1, 0, 2}), b.cuda),
                   bmm(widened(p.cpu).permute({1, 0, 2}), widened(b.cpu)), dt, K,
                   name + " permuted batch");
    // Transposed inner matrices within a batch.
    Pair bt = operand({B, N, K}, seed++, dt);
    expect_matches(bmm(a.cuda, bt.cuda.transpose(1, 2)),
                   bmm(widened(a.cpu), widened(bt.cpu).transpose(1, 2)), dt, K,
                   name + " batched B^T");
    // An expanded operand (batch stride 0).
    Pair one = operand({1, K, N}, seed++, dt);
    expect_matches(bmm(a.cuda, one.cuda.expand({B, K, N})),
                   bmm(widened(a.cpu), widened(one.cpu).expand({B, K, N})), dt, K,
                   name + " expanded B");
    Pair one_a = operand({1, M, K}, seed++, dt);
    expect_matches(bmm(one_a.cuda.expand({B, M, K}), b.cuda),
                   bmm(widened(one_a.cpu).expand({B, M, K}), widened(b.cpu)), dt, K,
                   name + " expanded A");
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(MatmulCuda, MatmulBroadcastingAndVectors) {
  TD_REQUIRE_CUDA();
  Tf32Scope exact(false);
  const int64_t M = 9, K = 31, N = 17;
  uint64_t seed = 400;
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {
      {{2, 1, M, K}, {3, K, N}},     // broadcast on both sides: out [2, 3, M, N]
      {{4, M, K}, {K, N}},           // shared matrix: folded into one [4M, K] x [K, N]
      {{2, 3, M, K}, {K, N}},        // 4-D x 2-D
      {{6, M, K}, {1, K, N}},        // b broadcast over the batch
      {{1, M, K}, {6, K, N}},        // a broadcast over the batch
      {{2, 3, M, K}, {2, 3, K, N}},  // two batch dims, merged into one batch of 6
      {{M, K}, {4, K, N}},           // 2-D x 3-D
      {{K}, {K, N}},                 // vector x matrix
      {{M, K}, {K}},                 // matrix x vector
      {{K}, {K}},                    // dot
      {{K}, {3, K, N}},              // vector x batch
  };
  for (DType dt : kTypes) {
    for (const Case& c : cases) {
      Pair a = operand(c.a, seed++, dt), b = operand(c.b, seed++, dt);
      expect_matches(
          matmul(a.cuda, b.cuda), matmul(widened(a.cpu), widened(b.cpu)), dt, K,
          std::string(dtype_name(dt)) + " matmul " + shape_str(c.a) + " x " + shape_str(c.b));
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(MatmulCuda, LinearWithAndWithoutBias) {
  TD_REQUIRE_CUDA();
  Tf32Scope exact(false);
  const int64_t in = 77, out = 45;
  uint64_t seed = 500;
  for (DType dt : kTypes) {
    const std::string name = dtype_name(dt);
    Pair x = operand({3, 11, in}, seed++, dt), w = operand({out, in}, seed++, dt);
    Pair bias = operand({out}, seed++, dt);
    Tensor xw = widened(x.cpu), ww = widened(w.cpu), bw = widened(bias.cpu);
    // The bias rides in the GEMM epilogue (Note [GEMM tolerances] for its rounding); each case
    // passes the product without the bias for the bound.
    expect_linear_matches(linear(x.cuda, w.cuda, bias.cuda), linear(xw, ww, bw), linear(xw, ww), dt,
                          in, name + " bias");
    expect_matches(linear(x.cuda, w.cuda), linear(xw, ww), dt, in, name + " no bias");
    // 1-D input, transposed input rows, a transposed weight view, a strided bias.
    Pair v = operand({in}, seed++, dt);
    Tensor vw = widened(v.cpu);
    expect_linear_matches(linear(v.cuda, w.cuda, bias.cuda), linear(vw, ww, bw), linear(vw, ww), dt,
                          in, name + " 1-D");
    Pair xt = operand({in, 13}, seed++, dt);
    Tensor xtw = widened(xt.cpu).t();
    expect_linear_matches(linear(xt.cuda.t(), w.cuda, bias.cuda), linear(xtw, ww, bw),
                          linear(xtw, ww), dt, in, name + " x^T");
    Pair wt = operand({in, out}, seed++, dt);
    Tensor wtw = widened(wt.cpu).t();
    expect_linear_matches(linear(x.cuda, wt.cuda.t(), bias.cuda), linear(xw, wtw, bw),
                          linear(xw, wtw), dt, in, name + " W^T view");
    Pair b2 = operand({2 * out}, seed++, dt);
    expect_linear_matches(linear(x.cuda, w.cuda, b2.cuda.slice(0, 1, 2 * out, 2)),
                          linear(xw, ww, widened(b2.cpu).slice(0, 1, 2 * out, 2)), linear(xw, ww),
                          dt, in, name + " strided bias");
    // Non-foldable input (permuted batch dims): made dense first.
    Pair xp = operand({11, 3, in}, seed++, dt);
    Tensor xpw = widened(xp.cpu).permute({1, 0, 2});
    expect_linear_matches(linear(xp.cuda.permute({1, 0, 2}), w.cuda, bias.cuda),
                          linear(xpw, ww, bw), linear(xpw, ww), dt, in, name + " permuted input");
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(MatmulCuda, EmptyProducts) {
  TD_REQUIRE_CUDA();
  for (DType dt : kTypes) {
    const std::string name = dtype_name(dt);
    // K = 0: a sum over nothing is 0 (plus the bias in linear).
    Tensor a = Tensor::empty({5, 0}, dt, gpu()), b = Tensor::empty({0, 7}, dt, gpu());
    Tensor c = mm(a, b);
    ASSERT_EQ(c.sizes(), (Shape{5, 7}));
    expect_close(host(c), std::vector<double>(35, 0.0), 0, 0, name + " K=0 mm");
    Tensor bb = bmm(Tensor::empty({3, 4, 0}, dt, gpu()), Tensor::empty({3, 0, 2}, dt, gpu()));
    expect_close(host(bb), std::vector<double>(24, 0.0), 0, 0, name + " K=0 bmm");
    Pair bias = operand({4}, 600, dt);
    Tensor y =
        linear(Tensor::empty({3, 0}, dt, gpu()), Tensor::empty({4, 0}, dt, gpu()), bias.cuda);
    std::vector<double> want;
    for (int r = 0; r < 3; ++r) {
      for (double v : doubles(bias.cpu)) want.push_back(v);
    }
    expect_close(host(y), want, 0, 0, name + " K=0 linear");
    // M = 0 or N = 0: empty results of the right shape.
    EXPECT_EQ(mm(Tensor::empty({0, 6}, dt, gpu()), Tensor::empty({6, 3}, dt, gpu())).sizes(),
              (Shape{0, 3}));
    EXPECT_EQ(mm(Tensor::empty({2, 6}, dt, gpu()), Tensor::empty({6, 0}, dt, gpu())).sizes(),
              (Shape{2, 0}));
    EXPECT_EQ(bmm(Tensor::empty({0, 2, 6}, dt, gpu()), Tensor::empty({0, 6, 3}, dt, gpu())).sizes(),
              (Shape{0, 2, 3}));
  }
}

namespace {

// Runs f on CPU leaves and on GPU copies of them, backpropagates the same random gradient
// through both and compares every input gradient.
template <typename F>
void expect_grads_match(const std::vector<Shape>& shapes, DType dt, int64_t K, uint64_t seed, F f,
                        const std::string& what) {
  std::vector<Tensor> cpu, cuda;
  for (const Shape& s : shapes) {
    Tensor c = randn_seeded(s, seed++, dt);
    Tensor g = c.to(gpu());
    c.set_requires_grad(true);
    g.set_requires_grad(true);
    cpu.push_back(c);
    cuda.push_back(g);
  }
  Tensor out_cpu = f(cpu), out_cuda = f(cuda);
  Tensor grad = randn_seeded(out_cpu.sizes(), seed++, dt);
  out_cpu.backward(grad);
  out_cuda.backward(grad.to(gpu()));
  // bf16 gradients are rounded on both sides, and some are sums (over broadcast batch dims,
  // over rows for the bias) of rounded products: each side is within a few roundings of the
  // largest terms, so the bound is two roundings of each element plus two of the tensor's
  // largest magnitude.
  const Tol t = tol_for(dt, K);
  for (size_t i = 0; i < shapes.size(); ++i) {
    ASSERT_TRUE(cuda[i].grad().defined()) << what << " input " << i;
    ASSERT_TRUE(cuda[i].grad().is_cuda()) << what << " input " << i;
    const std::vector<double> want = host(cpu[i].grad());
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    const double atol = dt == DType::Float32 ? t.atol : t.atol + 2 * t.rtol * scale;
    expect_close(host(cuda[i].grad()), want, atol, 2 * t.rtol,
                 what + " grad of input " + std::to_string(i));
  }
}

}  // namespace

TEST(MatmulCuda, GradientsMatchCpu) {
  TD_REQUIRE_CUDA();
  Tf32Scope exact(false);
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    const std::string name = dtype_name(dt);
    // The contraction lengths of the backward products are at most 64 here.
    expect_grads_match(
        {{13, 21}, {21, 9}}, dt, 64, 700,
        [](const std::vector<Tensor>& t) { return mm(t[0], t[1]); }, name + " mm");
    expect_grads_match(
        {{4, 13, 21}, {4, 21, 9}}, dt, 64, 710,
        [](const std::vector<Tensor>& t) { return bmm(t[0], t[1]); }, name + " bmm");
    expect_grads_match(
        {{2, 1, 13, 21}, {3, 21, 9}}, dt, 64, 720,
        [](const std::vector<Tensor>& t) { return matmul(t[0], t[1]); },
        name + " broadcast matmul");
    expect_grads_match(
        {{4, 13, 21}, {21, 9}}, dt, 64, 730,
        [](const std::vector<Tensor>& t) { return matmul(t[0], t[1]); }, name + " shared weight");
    expect_grads_match(
        {{21}, {21, 9}}, dt, 64, 740,
        [](const std::vector<Tensor>& t) { return matmul(t[0], t[1]); }, name + " vector x matrix");
    expect_grads_match(
        {{3, 5, 21}, {9, 21}, {9}}, dt, 64, 750,
        [](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); }, name + " linear");
    expect_grads_match(
        {{5, 21}, {9, 21}}, dt, 64, 760,
        [](const std::vector<Tensor>& t) { return linear(t[0], t[1]); }, name + " linear no bias");
    expect_grads_match(
        {{21, 13}, {21, 9}}, dt, 64, 770,
        [](const std::vector<Tensor>& t) { return mm(t[0].t(), t[1]); },
        name + " mm of a transpose");
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(MatmulCuda, BadArgumentsThrow) {
  TD_REQUIRE_CUDA();
  Tensor a = Tensor::empty({2, 3}, DType::Float32, gpu());
  Tensor b = Tensor::empty({3, 4}, DType::Float32, gpu());
  // Operands on different devices.
  EXPECT_THROW(mm(a, Tensor::empty({3, 4}, DType::Float32, kCPU)), Error);
  EXPECT_THROW(mm(Tensor::empty({2, 3}, DType::Float32, kCPU), b), Error);
  EXPECT_THROW(matmul(a, Tensor::empty({3}, DType::Float32, kCPU)), Error);
  EXPECT_THROW(linear(a, Tensor::empty({4, 3}, DType::Float32, gpu()),
                      Tensor::empty({4}, DType::Float32, kCPU)),
               Error);
  EXPECT_THROW(linear(a, Tensor::empty({4, 3}, DType::Float32, kCPU)), Error);
  // Shapes that do not multiply.
  EXPECT_THROW(mm(a, Tensor::empty({4, 5}, DType::Float32, gpu())), Error);
  EXPECT_THROW(bmm(Tensor::empty({2, 2, 3}, DType::Float32, gpu()),
                   Tensor::empty({3, 3, 4}, DType::Float32, gpu())),
               Error);
  EXPECT_THROW(matmul(Tensor::empty({2, 2, 3}, DType::Float32, gpu()),
                      Tensor::empty({3, 3, 4}, DType::Float32, gpu())),
               Error);
  EXPECT_THROW(linear(a, Tensor::empty({4, 5}, DType::Float32, gpu())), Error);
  EXPECT_THROW(linear(a, Tensor::empty({4, 3}, DType::Float32, gpu()),
                      Tensor::empty({5}, DType::Float32, gpu())),
               Error);
  // Mixed or non-floating dtypes.
  EXPECT_THROW(mm(a, Tensor::empty({3, 4}, DType::BFloat16, gpu())), Error);
  EXPECT_THROW(
      mm(Tensor::empty({2, 3}, DType::Int64, gpu()), Tensor::empty({3, 4}, DType::Int64, gpu())),
      Error);
}

// The epilogues through the kernel API itself (GELU with its aux output, bias gradient), where
// the test target sees kernels/ and the CUDA headers (see the report in the gemm task).
#if defined(TD_WITH_CUDA) && TD_WITH_CUDA && \
    __has_include("gemm/gemm.cuh") && __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>

#include "gemm/gemm.cuh"

TEST(MatmulCuda, GemmEpiloguesGeluAuxAndBiasGrad) {
  TD_REQUIRE_CUDA();
  const int64_t M = 33, K = 70, N = 64;  // N: the aux row stride must be a multiple of 8
  const DType dt = DType::BFloat16;
  Pair x = operand({M, K}, 800, dt), w = operand({N, K}, 801, dt), bias = operand({N}, 802, dt);
  Tensor y = Tensor::empty({M, N}, dt, gpu()), aux = Tensor::empty({M, N}, dt, gpu());
  const size_t ws = kernels::gemm_workspace_bytes();
  Tensor workspace = Tensor::empty({static_cast<int64_t>(ws / 4)}, DType::Float32, gpu());

  kernels::GemmArgs g;
  g.dtype = kernels::GemmType::kBFloat16;
  g.m = M;
  g.n = N;
  g.k = K;
  g.a = x.cuda.data_ptr();
  g.lda = K;
  g.b = w.cuda.data_ptr();  // W [N, K] row-major is op(B) = W^T
  g.ldb = K;
  g.trans_b = true;
  g.c = y.data_ptr();
  g.ldc = N;
  g.bias = bias.cuda.data_ptr();
  g.gelu = true;
  g.gelu_aux = aux.data_ptr();
  g.ld_aux = N;
  g.workspace = workspace.data_ptr();
  g.workspace_bytes = ws;
  g.stream = nullptr;  // the legacy default stream: the current stream of these tensors
  kernels::gemm(g);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // aux = x W^T + b (the GELU input), y = gelu_tanh(aux), each rounded to bf16 (twice where
  // the epilogue rounds the product first: Note [GEMM tolerances]).
  const std::vector<double> pre =
      doubles(linear(widened(x.cpu), widened(w.cpu), widened(bias.cpu)));
  std::vector<double> act(pre.size());
  for (size_t i = 0; i < pre.size(); ++i) {
    const double v = pre[i];
    act[i] = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
  }
  const std::vector<double> prod = doubles(linear(widened(x.cpu), widened(w.cpu)));
  const Tol t = tol_for(dt, K);
  expect_epilogue_close(host(aux), pre, prod, pre, dt, t.atol, 1.0, "gelu aux");
  expect_epilogue_close(host(y), act, prod, pre, dt, t.atol + 1e-3, 1.13, "gelu output");

  // Bias gradient fused into the weight gradient: dW = dY^T X and db = sum over rows of dY.
  const int64_t rows = 40, out = 24, in = 56;
  Pair dy = operand({rows, out}, 803, dt), xs = operand({rows, in}, 804, dt);
  Tensor dw = Tensor::empty({out, in}, dt, gpu()), db = Tensor::empty({out}, dt, gpu());
  kernels::GemmArgs gw;
  gw.dtype = kernels::GemmType::kBFloat16;
  gw.m = out;
  gw.n = in;
  gw.k = rows;
  gw.a = dy.cuda.data_ptr();  // dY [rows, out]: op(A) = dY^T
  gw.lda = out;
  gw.trans_a = true;
  gw.b = xs.cuda.data_ptr();
  gw.ldb = in;
  gw.c = dw.data_ptr();
  gw.ldc = in;
  gw.bias_grad_of = kernels::GemmBiasGrad::kA;
  gw.bias_grad = db.data_ptr();
  gw.workspace = workspace.data_ptr();
  gw.workspace_bytes = ws;
  kernels::gemm(gw);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Tol tr = tol_for(dt, rows);
  expect_close(host(dw), doubles(mm(widened(dy.cpu).t(), widened(xs.cpu))), tr.atol, tr.rtol, "dW");
  expect_close(host(db), doubles(sum(widened(dy.cpu), {0})), tr.atol, tr.rtol, "db");
}
#endif
