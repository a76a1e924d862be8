// matmul / mm / bmm / linear against a double-precision reference written here, on contiguous,
// transposed, sliced, expanded and broadcast operands, in fp32, bf16 and f16; gradients by
// finite differences and against the closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tardelli/tardelli.h"
#include "test_util.h"

namespace td::cpu {
int64_t onednn_primitives_created();  // src/ops/cpu/onednn.h (exported td:: symbol)
}

using namespace td;
using td::test::randn_seeded;

namespace {

// Reference C = A @ B for A [..., M, K], B [..., K, N] (>= 2-D, numpy batch broadcasting), in
// double over the logical values of any layout.
std::vector<double> ref_matmul(const Tensor& a, const Tensor& b, Shape* out_shape) {
  std::vector<float> av = to_vector<float>(a), bv = to_vector<float>(b);
  const int64_t na = a.dim(), nb = b.dim(), nd = std::max(na, nb);
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape batch(nd - 2), sa(nd - 2, 1), sb(nd - 2, 1);
  for (int64_t i = 0; i < nd - 2; ++i) {
    if (i - (nd - na) >= 0) sa[i] = a.size(i - (nd - na));
    if (i - (nd - nb) >= 0) sb[i] = b.size(i - (nd - nb));
    batch[i] = std::max(sa[i], sb[i]);
  }
  *out_shape = batch;
  out_shape->push_back(M);
  out_shape->push_back(N);
  int64_t nbatch = numel_of(batch);
  std::vector<double> out(nbatch * M * N, 0.0);
  for (int64_t bi = 0; bi < nbatch; ++bi) {
    int64_t rem = bi, oa = 0, ob = 0, ma = 1, mb = 1;
    for (int64_t i = nd - 3; i >= 0; --i) {
      int64_t idx = rem % batch[i];
      rem /= batch[i];
      oa += (sa[i] == 1 ? 0 : idx) * ma;
      ob += (sb[i] == 1 ? 0 : idx) * mb;
      ma *= sa[i];
      mb *= sb[i];
    }
    const float* A = av.data() + oa * M * K;
    const float* B = bv.data() + ob * K * N;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += static_cast<double>(A[m * K + k]) * B[k * N + n];
        out[(bi * M + m) * N + n] = s;
      }
    }
  }
  return out;
}

// |got - want| <= atol + rtol * |want| elementwise.
void expect_close(const Tensor& got, const std::vector<double>& want, double atol, double rtol) {
  std::vector<float> g = to_vector<float>(got);
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_NEAR(g[i], want[i], atol + rtol * std::fabs(want[i])) << "at flat index " << i;
  }
}

// fp32 with fp32 accumulation over K terms of unit-variance products: the error is a few ulps
// times sqrt(K) * |terms|; 1e-5 * K is a comfortable bound for K <= 200.
double fp32_atol(int64_t K) {
  return 1e-5 * static_cast<double>(K);
}

void check_matmul(const Tensor& a, const Tensor& b, double atol, double rtol) {
  Shape shape;
  std::vector<double> want = ref_matmul(a, b, &shape);
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.sizes(), shape);
  EXPECT_EQ(c.dtype(), a.dtype());
  expect_close(c, want, atol, rtol);
}

}  // namespace

// 2-D products of contiguous operands, including odd sizes and GEMV shapes.
TEST(Matmul, TwoDContiguous) {
  for (auto [M, K, N] :
       {std::tuple{1, 1, 1}, {7, 13, 5}, {64, 100, 33}, {1, 50, 17}, {19, 50, 1}}) {
    check_matmul(randn_seeded({M, K}, 1), randn_seeded({K, N}, 2), fp32_atol(K), 0);
  }
}

// Transposed operands (column-major to oneDNN) and sliced ones (row stride > columns) give the
// same values as their contiguous copies; a slice with no unit stride is copied internally.
TEST(Matmul, NonContiguousOperands) {
  Tensor at = randn_seeded({40, 30}, 3).t();  // [30, 40], strides (1, 30)
  Tensor bt = randn_seeded({20, 40}, 4).t();  // [40, 20], strides (1, 40)
  check_matmul(at, bt, fp32_atol(40), 0);
  Tensor an = randn_seeded({30, 50}, 5).narrow(1, 7, 40);  // row stride 50
  check_matmul(an, bt, fp32_atol(40), 0);
  Tensor as = randn_seeded({60, 80}, 6).slice(0, 0, 60, 2).slice(1, 0, 80, 2);  // no unit stride
  check_matmul(as, randn_seeded({40, 9}, 7), fp32_atol(40), 0);
  // Attention-style permuted batch: [B, T, H, D] -> [B, H, T, D] has batch stride < row extent.
  Tensor q = randn_seeded({2, 11, 3, 8}, 8).transpose(1, 2);
  Tensor k = randn_seeded({2, 13, 3, 8}, 9).transpose(1, 2);
  check_matmul(q, k.transpose(2, 3), fp32_atol(8), 0);
}

// Products large enough for oneDNN's fp32 GEMM to have its operands repacked first (Note
// [Operand layouts for sgemm], src/ops/cpu/onednn.cpp: a column-major A with M >= 1024 and
// K >= 256, a row-major B with 64 <= M <= 256 and K, N >= 512), in all four layouts, including
// the linear weight gradient's dY^T X and a sliced (offset, padded) operand. The result must not
// depend on the layout: same reference, same fp32 tolerance (K = 512 terms of unit variance:
// the accumulated rounding is ~sqrt(K) ulps of |terms|, well inside 1e-5 * K).
TEST(Matmul, RepackedLayouts) {
  const int64_t M = 96, K = 512, N = 520;
  Tensor a = randn_seeded({M, K}, 21), at = randn_seeded({K, M}, 22).t();
  Tensor b = randn_seeded({K, N}, 23), bt = randn_seeded({N, K}, 24).t();
  check_matmul(a, b, fp32_atol(K), 0);    // NN: B repacked column-major
  check_matmul(at, b, fp32_atol(K), 0);   // TN: B repacked (A is short)
  check_matmul(a, bt, fp32_atol(K), 0);   // NT: as is
  check_matmul(at, bt, fp32_atol(K), 0);  // TT: as is
  Tensor padded = randn_seeded({K + 3, M + 5}, 27).narrow(0, 2, K).narrow(1, 4, M).t();
  check_matmul(padded, b, fp32_atol(K), 0);
  // A tall column-major A (M = 1024): repacked row-major; as dY^T X of a linear layer.
  Tensor g = randn_seeded({K, 1024}, 25), x = randn_seeded({K, 130}, 26);
  check_matmul(g.t(), x, fp32_atol(K), 0);
  check_matmul(g.narrow(1, 0, 1024).t(), randn_seeded({130, K}, 28).t(), fp32_atol(K), 0);
}

// Products whose operands have a power-of-two leading dimension >= 1024 floats are run on a copy
// with a padded leading dimension (Note [Padded leading dimensions]): a column-major A with a
// long contraction (a linear layer's dY^T X), a row-major B, a column-major B (x W^T, also with
// a bias), and a sliced operand (offset, leading dimension 2048). Same reference and tolerance
// as above (K = 1024 terms).
TEST(Matmul, PaddedLeadingDimensions) {
  const int64_t K = 1024;
  Tensor at = randn_seeded({K, 1024}, 41).t();  // [1024, K], column-major, lda 1024
  check_matmul(at, randn_seeded({K, 16}, 42), fp32_atol(K), 0);
  Tensor a = randn_seeded({16, K}, 43);
  check_matmul(a, randn_seeded({K, 1024}, 44), fp32_atol(K), 0);       // B row-major, ldb 1024
  check_matmul(a, randn_seeded({1024, K}, 45).t(), fp32_atol(K), 0);   // B column-major
  Tensor sliced = randn_seeded({K, 2048}, 46).narrow(1, 8, 1024).t();  // lda 2048, offset 8
  check_matmul(sliced, randn_seeded({K, 16}, 47), fp32_atol(K), 0);
  Tensor w = randn_seeded({1024, K}, 48), bias = randn_seeded({1024}, 49);
  Shape shape;
  std::vector<double> want = ref_matmul(a, w.t(), &shape);
  std::vector<float> bv = to_vector<float>(bias);
  for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 1024];
  expect_close(linear(a, w, bias), want, fp32_atol(K), 0);
}

// Batch dims broadcast like numpy: size-1 dims, missing leading dims, expanded (stride 0)
// operands, and a 2-D weight shared by a whole batch (folded into one GEMM).
TEST(Matmul, BroadcastBatch) {
  check_matmul(randn_seeded({2, 1, 5, 6}, 10), randn_seeded({3, 6, 4}, 11), fp32_atol(6), 0);
  check_matmul(randn_seeded({4, 5, 6}, 12), randn_seeded({6, 7}, 13), fp32_atol(6), 0);
  check_matmul(randn_seeded({6, 7}, 14), randn_seeded({2, 3, 7, 5}, 15), fp32_atol(7), 0);
  check_matmul(randn_seeded({1, 5, 6}, 16).expand({4, 5, 6}), randn_seeded({4, 6, 3}, 17),
               fp32_atol(6), 0);
  check_matmul(randn_seeded({1, 5, 6}, 18).expand({4, 5, 6}),
               randn_seeded({1, 6, 3}, 19).expand({4, 6, 3}), fp32_atol(6), 0);
  // Batch not collapsible into rows (transposed batch): still one batched primitive.
  check_matmul(randn_seeded({5, 3, 6}, 20).transpose(0, 1), randn_seeded({6, 2}, 21), fp32_atol(6),
               0);
}

// 1-D operands follow torch.matmul: dot, matrix-vector, vector-matrix, batched matrix-vector.
TEST(Matmul, OneDimensionalOperands) {
  Tensor v = randn_seeded({9}, 22), w = randn_seeded({9}, 23);
  std::vector<float> vv = to_vector<float>(v), wv = to_vector<float>(w);
  double dot = 0;
  for (int i = 0; i < 9; ++i) dot += static_cast<double>(vv[i]) * wv[i];
  Tensor d = matmul(v, w);
  EXPECT_EQ(d.dim(), 0);
  EXPECT_NEAR(d.item<float>(), dot, 1e-5);

  Tensor A = randn_seeded({4, 9}, 24);
  Shape s;
  std::vector<double> want = ref_matmul(A, v.view({9, 1}), &s);
  Tensor mv = matmul(A, v);
  EXPECT_EQ(mv.sizes(), (Shape{4}));
  expect_close(mv, want, 1e-4, 0);

  Tensor B = randn_seeded({3, 9, 5}, 25);
  want = ref_matmul(v.view({1, 9}), B, &s);
  Tensor vm = matmul(v, B);
  EXPECT_EQ(vm.sizes(), (Shape{3, 5}));
  expect_close(vm, want, 1e-4, 0);

  want = ref_matmul(B.transpose(1, 2), randn_seeded({9, 1}, 26), &s);
  Tensor bmv = matmul(B.transpose(1, 2), randn_seeded({9}, 26));
  EXPECT_EQ(bmv.sizes(), (Shape{3, 5}));
  expect_close(bmv, want, 1e-4, 0);
}

// bf16/f16 in, same dtype out, fp32 accumulation inside: the only error beyond fp32's is the
// final rounding of each output (relative 2^-8 for bf16, 2^-11 for f16; we allow 2x). The
// reference uses the already-rounded inputs, so input rounding does not count.
TEST(Matmul, ReducedPrecision) {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    double rtol = dt == DType::BFloat16 ? 2.0 / 256 : 2.0 / 2048;
    Tensor a = randn_seeded({3, 33, 70}, 27, dt), b = randn_seeded({70, 21}, 28, dt);
    check_matmul(a, b, fp32_atol(70), rtol);
    check_matmul(a.transpose(1, 2).contiguous().transpose(1, 2), b.t().contiguous().t(),
                 fp32_atol(70), rtol);
    Tensor l = linear(a, b.t(), randn_seeded({21}, 29, dt));
    EXPECT_EQ(l.dtype(), dt);
  }
}

// Products with an empty dimension: K = 0 gives zeros (and bias for linear), M = 0 gives [0, N].
TEST(Matmul, EmptyDims) {
  Tensor z = matmul(randn_seeded({3, 0}, 30), randn_seeded({0, 4}, 31));
  EXPECT_EQ(z.sizes(), (Shape{3, 4}));
  for (float v : to_vector<float>(z)) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(matmul(randn_seeded({0, 5}, 32), randn_seeded({5, 4}, 33)).sizes(), (Shape{0, 4}));
  Tensor bias = randn_seeded({4}, 34);
  Tensor l = linear(randn_seeded({2, 0}, 35), randn_seeded({4, 0}, 36), bias);
  std::vector<float> lv = to_vector<float>(l), bv = to_vector<float>(bias);
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(lv[r * 4 + j], bv[j]);
  }
}

// mm and bmm are the 2-D and equal-batch 3-D cases and reject anything else.
TEST(Matmul, MmAndBmm) {
  Shape s;
  Tensor a = randn_seeded({6, 8}, 37), b = randn_seeded({8, 3}, 38);
  expect_close(mm(a, b), ref_matmul(a, b, &s), fp32_atol(8), 0);
  Tensor x = randn_seeded({4, 6, 8}, 39), y = randn_seeded({4, 3, 8}, 40).transpose(1, 2);
  expect_close(bmm(x, y), ref_matmul(x, y, &s), fp32_atol(8), 0);
  EXPECT_THROW(mm(x, b), Error);
  EXPECT_THROW(bmm(a, b), Error);
  EXPECT_THROW(bmm(x, randn_seeded({3, 8, 2}, 41)), Error);
}

// linear(x, W, b) = x W^T + b for any leading dims and layouts of x and W.
TEST(Matmul, LinearMatchesReference) {
  Tensor x = randn_seeded({2, 5, 12}, 42), W = randn_seeded({7, 12}, 43), b = randn_seeded({7}, 44);
  for (const Tensor& xi :
       {x, randn_seeded({5, 2, 12}, 45).transpose(0, 1), randn_seeded({12}, 46)}) {
    for (const Tensor& Wi : {W, randn_seeded({12, 7}, 47).t()}) {
      Shape s;
      std::vector<double> want = ref_matmul(xi.dim() == 1 ? xi.view({1, 12}) : xi, Wi.t(), &s);
      std::vector<float> bv = to_vector<float>(b);
      for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 7];
      Tensor y = linear(xi, Wi, b);
      Shape ws = xi.sizes();
      ws.back() = 7;
      EXPECT_EQ(y.sizes(), ws);
      expect_close(y, want, fp32_atol(12), 0);
      Shape s2;
      expect_close(linear(xi, Wi), ref_matmul(xi.dim() == 1 ? xi.view({1, 12}) : xi, Wi.t(), &s2),
                   fp32_atol(12), 0);
    }
  }
}

// Gradients agree with central differences for broadcast, transposed and 1-D operands.
TEST(Matmul, GradcheckMatmul) {
  auto leaf = [](const Shape& s, uint64_t seed) {
    return randn_seeded(s, seed).set_requires_grad(true);
  };
  std::vector<std::pair<Tensor, Tensor>> cases = {
      {leaf({3, 4}, 50), leaf({4, 5}, 51)},    {leaf({2, 1, 3, 4}, 52), leaf({3, 4, 2}, 53)},
      {leaf({2, 3, 4}, 54), leaf({4, 2}, 55)}, {leaf({3, 4}, 56), leaf({2, 4, 3}, 57)},
      {leaf({4}, 58), leaf({2, 4, 3}, 59)},    {leaf({2, 3, 4}, 60), leaf({4}, 61)},
  };
  for (auto& [a, b] : cases) {
    auto r = autograd::gradcheck([](const TensorList& in) { return matmul(in[0], in[1]); }, {a, b});
    EXPECT_TRUE(r.ok) << r.message;
  }
  // Transposed views as the differentiated inputs.
  Tensor a = leaf({4, 3}, 62), b = leaf({5, 4}, 63);
  auto r = autograd::gradcheck([](const TensorList& in) { return matmul(in[0].t(), in[1].t()); },
                               {a, b});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Matmul, GradcheckLinear) {
  Tensor x = randn_seeded({2, 3, 4}, 64).set_requires_grad(true);
  Tensor W = randn_seeded({5, 4}, 65).set_requires_grad(true);
  Tensor b = randn_seeded({5}, 66).set_requires_grad(true);
  auto r = autograd::gradcheck([](const TensorList& in) { return linear(in[0], in[1], in[2]); },
                               {x, W, b});
  EXPECT_TRUE(r.ok) << r.message;
  auto r2 = autograd::gradcheck([](const TensorList& in) { return linear(in[0], in[1]); }, {x, W});
  EXPECT_TRUE(r2.ok) << r2.message;
}

// Closed-form gradients of sum(linear(x, W, b) * G): dx = G W, dW = G^T x, db = sum_rows G,
// checked in double on a bigger case than gradcheck can afford.
TEST(Matmul, LinearGradientsClosedForm) {
  const int64_t R = 24, I = 40, O = 18;
  Tensor x = randn_seeded({R, I}, 67).set_requires_grad(true);
  Tensor W = randn_seeded({O, I}, 68).set_requires_grad(true);
  Tensor b = randn_seeded({O}, 69).set_requires_grad(true);
  Tensor G = randn_seeded({R, O}, 70);
  linear(x, W, b).backward(G);
  Shape s;
  expect_close(x.grad(), ref_matmul(G, W, &s), fp32_atol(O), 0);
  expect_close(W.grad(), ref_matmul(G.t(), x.detach(), &s), fp32_atol(R), 0);
  std::vector<float> gv = to_vector<float>(G);
  std::vector<double> db(O, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t o = 0; o < O; ++o) db[o] += gv[r * O + o];
  }
  expect_close(b.grad(), db, 1e-5 * R, 0);
}

// Bad input raises td::Error naming the op and both shapes; nothing crashes.
// Property (Note [Matmul scratchpad] in src/ops/cpu/onednn.cpp): one cached primitive run by
// several threads at once gives every thread the single-threaded product, up to the rounding
// of a GEMM blocked for another OpenMP team size (rtol 1e-5 of the largest entry); with the
// primitive's shared scratchpad a concurrent run was off by whole units now and then.
TEST(Matmul, ConcurrentThreadsShareCachedPrimitives) {
  for (const Shape& s : {Shape{64, 64}, Shape{96, 200}}) {
    const Tensor a = td::test::randn_seeded(s, 3), b = td::test::randn_seeded({s[1], 72}, 4);
    const std::vector<float> want = to_vector<float>(matmul(a, b));
    double scale = 0.0;
    for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    std::vector<double> worst(4, 0.0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 50; ++i) {
          const std::vector<float> got = to_vector<float>(matmul(a.clone(), b.clone()));
          for (size_t j = 0; j < got.size(); ++j) {
            worst[t] = std::max(worst[t], std::fabs(static_cast<double>(got[j]) - want[j]));
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (int t = 0; t < 4; ++t) EXPECT_LE(worst[t], 1e-5 * scale) << "thread " << t;
  }
}

TEST(Matmul, BadInputIsAnError) {
  try {
    matmul(randn_seeded({3, 4}, 71), randn_seeded({5, 6}, 72));
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
    EXPECT_NE(m.find("[5, 6]"), std::string::npos) << m;
  }
  EXPECT_THROW(matmul(randn_seeded({2, 3, 4}, 73), randn_seeded({3, 4, 5}, 74)),
               Error);  // batch 2 vs 3
  EXPECT_THROW(matmul(randn_seeded({3, 4}, 75), randn_seeded({4, 5}, 76, DType::BFloat16)), Error);
  EXPECT_THROW(matmul(scalar_tensor(1.0), randn_seeded({4}, 77)), Error);
  EXPECT_THROW(matmul(arange(0, 4).view({2, 2}), arange(0, 4).view({2, 2})), Error);
  EXPECT_THROW(matmul(Tensor(), randn_seeded({4}, 78)), Error);
  EXPECT_THROW(linear(randn_seeded({2, 4}, 79), randn_seeded({5, 3}, 80)), Error);
  EXPECT_THROW(linear(randn_seeded({2, 4}, 81), randn_seeded({5, 4}, 82), randn_seeded({4}, 83)),
               Error);
  EXPECT_THROW(linear(randn_seeded({2, 4}, 84), randn_seeded({5, 4}, 85, DType::BFloat16)), Error);
}

// Repeating a product with the same shapes and layouts reuses the cached primitive.
TEST(Matmul, PrimitivesAreCached) {
  Tensor a = randn_seeded({17, 23}, 86), b = randn_seeded({23, 29}, 87).t().contiguous().t();
  matmul(a, b);
  int64_t before = cpu::onednn_primitives_created();
  for (int i = 0; i < 5; ++i) matmul(randn_seeded({17, 23}, 88 + i), b);
  EXPECT_EQ(cpu::onednn_primitives_created(), before);
}

// cpu_matmul_kernel names what each floating dtype runs: fp32 always has a native oneDNN kernel
// (never its reference loop); bf16/f16 either have one or are reported as widened to fp32.
TEST(Matmul, CpuKernelIsReported) {
  const std::string f32 = cpu_matmul_kernel(DType::Float32);
  EXPECT_FALSE(f32.empty());
  EXPECT_NE(f32.rfind("ref", 0), 0u) << f32;
  EXPECT_EQ(f32.find("widening"), std::string::npos) << f32;
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    const std::string k = cpu_matmul_kernel(dt);
    EXPECT_TRUE(k.rfind("fp32 widening (oneDNN: ", 0) == 0 || k.rfind("ref", 0) != 0) << k;
  }
  EXPECT_FALSE(cpu_isa().empty());
  EXPECT_THROW(cpu_matmul_kernel(DType::Int64), Error);
}

// Where the CPU has AMX, bf16 products must run on it (through oneDNN's AMX kernels), not on
// AVX-512 or widened to fp32. Checked against the CPU's own flags, so an OS that withholds AMX
// from the process (Linux < 5.16) or a wrongly capped ONEDNN_MAX_CPU_ISA fails here.
TEST(Matmul, Bf16UsesAmxWhereTheCpuHasIt) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  bool amx = false;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      amx = line.find(" amx_bf16") != std::string::npos;
      break;
    }
  }
  const std::string kernel = cpu_matmul_kernel(DType::BFloat16);
  if (!amx) {
    GTEST_SKIP() << "this CPU has no AMX (oneDNN ISA " << cpu_isa() << "); bf16 products run as "
                 << kernel;
  }
  EXPECT_EQ(cpu_isa(), "avx512_core_amx");
  EXPECT_NE(kernel.find("amx"), std::string::npos) << kernel;
}
