// FP8 linear layers emulated on the CPU (ops/fp8.h): Note [FP8 emulation], Note [FP8 scaling],
// Note [Deferred amax].
//
// Properties: fake quantization is the elementwise fp8 round trip of x * s, divided by s; the
// FP8 linear's forward and its three gradients equal the same products computed here from the
// quantized operands (the same ops, so exactly); the gradient is quantized in E5M2 (hybrid) or
// E4M3 (e4m3) and the bias gradient is the unquantized sum; delayed scaling uses the history's
// largest amax, current scaling this tensor's, both by the formula fp8_max / amax / 2^margin;
// noted amaxes are committed once; the saturation/flush counts match the format edges; the
// GPT's FP8 blocks under full recomputation equal no recomputation bitwise. Equalities are
// exact.
#include "tardelli/ops/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tardelli/autograd/engine.h"
#include "tardelli/models/gpt.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::test::same_bytes;

namespace {

Tensor param(const Shape& s, uint64_t seed, double scale) {
  Tensor t = mul(td::test::randn_seeded(s, seed), scale);
  t.set_requires_grad(true);
  return t;
}

}  // namespace

TEST(Fp8Ops, FakeQuantizeIsTheElementwiseRoundTrip) {
  Tensor x = mul(td::test::randn_seeded({257}, 3), 100.0);
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    const double s = 0.5;
    Tensor q = fp8_fake_quantize(x, f, s);
    const std::vector<float> xv = to_vector<float>(x), qv = to_vector<float>(q);
    for (size_t i = 0; i < xv.size(); ++i) {
      const float want = fp8_to_float(fp8_from_float(xv[i] * 0.5f, f), f) / 0.5f;
      ASSERT_EQ(qv[i], want) << fp8_format_name(f) << " " << xv[i];
    }
  }
  // Saturation at the format's max over the scale.
  Tensor big = from_vector<float>({1e6f, -1e6f}, {2});
  EXPECT_EQ(to_vector<float>(fp8_fake_quantize(big, Fp8Format::E4M3FN, 1.0)),
            (std::vector<float>{448.0f, -448.0f}));
  EXPECT_NE(td::test::error_of([&] {
              fp8_fake_quantize(big, Fp8Format::E5M2, 0.0);
            }).find("the scale must be finite and > 0"),
            std::string::npos);
}

// Property: fp8_quantize gives the codes (a float8 tensor) whose values, divided by the scale,
// fp8_dequantize returns: the same values as the fake quantization; both refuse other dtypes.
TEST(Fp8Ops, QuantizeGivesTheCodesDequantizeTheirValues) {
  Tensor x = mul(td::test::randn_seeded({4, 33}, 5), 50.0);
  Tensor q = fp8_quantize(x, Fp8Format::E5M2, 3.0);
  EXPECT_EQ(q.dtype(), DType::Float8E5M2);
  EXPECT_EQ(q.sizes(), x.sizes());
  const std::vector<float> xv = to_vector<float>(x), qv = to_vector<float>(q);
  for (size_t i = 0; i < xv.size(); ++i) {
    ASSERT_EQ(qv[i], fp8_to_float(fp8_from_float(xv[i] * 3.0f, Fp8Format::E5M2), Fp8Format::E5M2));
  }
  EXPECT_TRUE(same_bytes(fp8_dequantize(q, 3.0), fp8_fake_quantize(x, Fp8Format::E5M2, 3.0)));
  EXPECT_EQ(fp8_dequantize(q, 3.0, DType::BFloat16).dtype(), DType::BFloat16);
  EXPECT_NE(td::test::error_of([&] { fp8_dequantize(x, 1.0); }).find("expected a float8 tensor"),
            std::string::npos);
  EXPECT_NE(td::test::error_of([&] {
              fp8_quantize(q, Fp8Format::E4M3FN, 1.0);
            }).find("expected a floating tensor"),
            std::string::npos);
}

// Property: fp8_scaled_mm is the fp32 product of the dequantized operands, a [m, k] times
// b [n, k] transposed, plus the bias, rounded once to the output dtype (exactly: the same ops);
// strided operands are taken as they are; bad operands are named.
TEST(Fp8Ops, ScaledMmIsTheProductOfTheDequantizedOperands) {
  Tensor a = fp8_quantize(td::test::randn_seeded({5, 32}, 1), Fp8Format::E4M3FN, 100.0);
  Tensor bt = fp8_quantize(td::test::randn_seeded({32, 7}, 2), Fp8Format::E5M2, 1000.0);
  Tensor b = transpose(bt, 0, 1);  // [7, 32], a view
  Tensor bias = td::test::randn_seeded({7}, 3).to(DType::BFloat16);
  Tensor got = fp8_scaled_mm(a, 100.0, b, 1000.0, DType::BFloat16, bias);
  Tensor want = linear(fp8_dequantize(a, 100.0), fp8_dequantize(b, 1000.0), bias.to(DType::Float32))
                    .to(DType::BFloat16);
  EXPECT_EQ(got.dtype(), DType::BFloat16);
  EXPECT_TRUE(same_bytes(got, want));
  EXPECT_NE(td::test::error_of([&] {
              fp8_scaled_mm(a.to(DType::Float32), 1.0, b, 1.0, DType::Float32);
            }).find("expected float8 operands"),
            std::string::npos);
  EXPECT_NE(td::test::error_of([&] {
              fp8_scaled_mm(a, 1.0, bt, 1.0, DType::Float32);
            }).find("are not [m, k] and [n, k]"),
            std::string::npos);
  EXPECT_NE(td::test::error_of([&] {
              fp8_scaled_mm(a, 1.0, b, 1.0, DType::Float32, td::test::randn_seeded({6}, 1));
            }).find("is not a floating [7] vector"),
            std::string::npos);
  EXPECT_NE(td::test::error_of([&] {
              fp8_scaled_mm(a, 0.0, b, 1.0, DType::Float32);
            }).find("the scale must be finite and > 0"),
            std::string::npos);
}

TEST(Fp8Ops, LinearForwardAndBackwardAreTheQuantizedProducts) {
  Tensor x = param({3, 5, 16}, 1, 2.0), w = param({8, 16}, 2, 0.3), b = param({8}, 3, 0.1);
  Fp8LinearState st(/*history=*/0);  // current scaling: scales from these tensors
  const double sx = st.input.scale_from(amax(x), 1.0), sw = st.weight.scale_from(amax(w), 1.0);
  Tensor y = fp8_linear(x, w, b, st);
  Tensor xq = fp8_fake_quantize(x, Fp8Format::E4M3FN, sx);
  Tensor wq = fp8_fake_quantize(w, Fp8Format::E4M3FN, sw);
  Tensor want;
  {
    autograd::NoGradGuard ng;
    want = linear(xq, wq, b.detach());
  }
  EXPECT_TRUE(same_bytes(y.detach(), want));
  EXPECT_GT(max(abs(sub(y.detach(), linear(x.detach(), w.detach(), b.detach())))).item<double>(),
            1e-4)
      << "quantization changes the product";
  Tensor gy = td::test::randn_seeded({3, 5, 8}, 9);
  y.backward(gy);
  const double sg = st.grad.scale_from(amax(gy), 1.0);
  Tensor gq = reshape(fp8_fake_quantize(gy, Fp8Format::E5M2, sg), {15, 8});
  EXPECT_TRUE(same_bytes(x.grad(), reshape(mm(gq, wq), {3, 5, 16})));
  EXPECT_TRUE(same_bytes(w.grad(), mm(transpose(gq, 0, 1), reshape(xq, {15, 16}))));
  EXPECT_TRUE(same_bytes(b.grad(), sum(reshape(gy, {15, 8}), {0})));
  EXPECT_EQ(st.grad.scale(), sg);
}

// Property: amax is max |x| in x's own dtype, the same value as in fp32 (abs and max are
// exact), NaN when x holds a NaN, 0 for an empty tensor.
TEST(Fp8Ops, AmaxIsExactInEveryDtype) {
  Tensor x = mul(td::test::randn_seeded({301}, 8), 7.0);
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Tensor y = x.to(dt);
    EXPECT_EQ(amax(y), amax(y.to(DType::Float32))) << dtype_name(dt);
    Tensor n = y.clone();
    n.narrow(0, 100, 1).fill_(NAN);
    EXPECT_TRUE(std::isnan(amax(n))) << dtype_name(dt);
  }
  EXPECT_EQ(amax(Tensor::empty({0}, DType::BFloat16)), 0.0);
}

TEST(Fp8Ops, DelayedAndCurrentScaling) {
  Fp8Scaling d(Fp8Format::E4M3FN, /*history=*/3, /*margin=*/1.0);
  EXPECT_EQ(d.scale(), 1.0);
  Tensor x = from_vector<float>({2.0f, -8.0f}, {2});
  EXPECT_EQ(d.scale_for(x), 1.0);  // delayed: the history's, not x's
  for (double a : {4.0, 16.0, 2.0}) d.record(a);
  EXPECT_EQ(d.scale(), 448.0 / 16.0 / 2.0);
  d.record(1.0);  // 4.0 leaves the window, 16 stays
  EXPECT_EQ(d.scale(), 448.0 / 16.0 / 2.0);
  d.record(1.0);
  d.record(1.0);  // 16 has left
  EXPECT_EQ(d.scale(), 448.0 / 1.0 / 2.0);
  d.record(0.0);
  d.record(NAN);
  d.record(0.0);  // nothing usable in the window: the scale stays
  EXPECT_EQ(d.scale(), 448.0 / 2.0);
  Fp8Scaling c(Fp8Format::E5M2, 0);
  EXPECT_EQ(c.scale_for(x), 57344.0 / 8.0);
  EXPECT_NE(td::test::error_of([] { Fp8Scaling(Fp8Format::E5M2, -1); }).find("history must be"),
            std::string::npos);
}

// Property: the e4m3 recipe quantizes the output gradient in E4M3 (not E5M2): the input
// gradient equals the product with the E4M3-quantized gradient exactly.
TEST(Fp8Ops, E4m3RecipeQuantizesTheGradientInE4m3) {
  Tensor x = param({4, 16}, 1, 2.0), w = param({8, 16}, 2, 0.3);
  Fp8LinearState st(/*history=*/0, 0.0, Fp8Recipe::E4M3);
  EXPECT_EQ(st.grad.format(), Fp8Format::E4M3FN);
  Tensor y = fp8_linear(x, w, Tensor(), st);
  Tensor gy = mul(td::test::randn_seeded({4, 8}, 9), 1e-3);
  y.backward(gy);
  const double sg = st.grad.scale_from(amax(gy), 1.0);
  EXPECT_EQ(sg, 448.0 / amax(gy));
  Tensor wq =
      fp8_fake_quantize(w.detach(), Fp8Format::E4M3FN, st.weight.scale_from(amax(w.detach()), 1.0));
  EXPECT_TRUE(same_bytes(x.grad(), mm(fp8_fake_quantize(gy, Fp8Format::E4M3FN, sg), wq)));
  EXPECT_FALSE(
      same_bytes(x.grad(), mm(fp8_fake_quantize(gy, Fp8Format::E5M2, 57344.0 / amax(gy)), wq)))
      << "E5M2 would round differently";
  EXPECT_EQ(parse_fp8_recipe("e4m3"), Fp8Recipe::E4M3);
  EXPECT_NE(td::test::error_of([] { parse_fp8_recipe("e5m2"); }).find("'e5m2'"), std::string::npos);
}

// Property (Note [Deferred amax]): observed amaxes leave the scale alone until commit(), which
// records their max once; observing the same value twice is the same as once; commit(a)
// records the given (reduced) value; a non-finite amax is noted as +inf and ignored by the
// history's max; nothing pending: commit does nothing.
TEST(Fp8Ops, DeferredAmaxIsCommittedOncePerStep) {
  Fp8Scaling s(Fp8Format::E4M3FN, /*history=*/4);
  EXPECT_EQ(s.pending(), -1.0);
  s.observe(2.0);
  s.observe(8.0);
  s.observe(8.0);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.pending(), 8.0);
  s.commit();
  EXPECT_EQ(s.history(), std::deque<double>({8.0}));
  EXPECT_EQ(s.scale(), 448.0 / 8.0);
  EXPECT_EQ(s.pending(), -1.0);
  s.commit();  // nothing pending
  EXPECT_EQ(s.history().size(), 1u);
  s.observe(1.0);
  s.commit(32.0);  // the group's max
  EXPECT_EQ(s.history(), std::deque<double>({8.0, 32.0}));
  EXPECT_EQ(s.scale(), 448.0 / 32.0);
  s.observe(NAN);
  EXPECT_EQ(s.pending(), INFINITY);
  s.commit();
  EXPECT_EQ(s.scale(), 448.0 / 32.0);
}

// Property: amaxes observed as tensors (left on their device until the commit) give the same
// pending max, history and scale as the same values observed as numbers, mixed with them too;
// a NaN tensor counts as +inf; commit(a) drops what is still on the device.
TEST(Fp8Ops, DeviceObservedAmaxesFoldAtTheCommit) {
  Fp8Scaling host(Fp8Format::E4M3FN, 4), dev(Fp8Format::E4M3FN, 4);
  const Tensor a = from_vector<float>({2.0f, -9.5f}, {2}), b = from_vector<float>({3.25f}, {1});
  host.observe(amax(a));
  host.observe(amax(b));
  dev.observe(amax_tensor(a));
  dev.observe(1.0);
  dev.observe(amax_tensor(b));
  EXPECT_EQ(amax_tensor(a).dim(), 0);
  EXPECT_EQ(dev.pending(), host.pending());
  host.commit();
  dev.commit();
  EXPECT_EQ(dev.history(), host.history());
  EXPECT_EQ(dev.scale(), 448.0 / 9.5);
  dev.observe(amax_tensor(from_vector<float>({1.0f, NAN}, {2})));
  EXPECT_EQ(dev.pending(), INFINITY);
  dev.commit(4.0);
  dev.observe(amax_tensor(a));
  dev.commit(2.0);  // the group's value; the device amax is dropped, not folded later
  EXPECT_EQ(dev.pending(), -1.0);
  EXPECT_EQ(dev.history(), std::deque<double>({9.5, 4.0, 2.0}));
}

// Property: fp8_count counts the values beyond the format's max after scaling (saturated) and
// the nonzero ones at or below half the smallest subnormal (flushed), for both formats.
TEST(Fp8Ops, CountsOverflowAndUnderflow) {
  Tensor x = from_vector<float>({0.0f, 1.0f, -500.0f, 449.0f, std::ldexp(1.0f, -10),
                                 std::ldexp(1.0f, -9), -std::ldexp(1.0f, -11)},
                                {7});
  Fp8Counts c = fp8_count(x, Fp8Format::E4M3FN, 1.0);
  EXPECT_EQ(c.values, 7);
  EXPECT_EQ(c.overflow, 2);   // -500, 449
  EXPECT_EQ(c.underflow, 2);  // 2^-10 (the tie rounds to 0), -2^-11; 2^-9 is representable
  Fp8Counts e = fp8_count(x, Fp8Format::E5M2, 1.0);
  EXPECT_EQ(e.overflow, 0);
  EXPECT_EQ(e.underflow, 0);
  EXPECT_EQ(fp8_count(x, Fp8Format::E4M3FN, 1e-3).overflow, 0);
}

namespace {

models::GPTConfig small_gpt() {
  models::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 32;
  return c;
}

}  // namespace

// Property: GPT::set_fp8 routes the blocks' four linears through fp8_linear: a training step
// changes the loss against the same model without FP8 (quantization); its amaxes are pending
// until commit_fp8(), which fills every linear's history once; an evaluation forward notes
// nothing.
TEST(Fp8Ops, GptBlocksUseFp8Linears) {
  const models::GPTConfig c = small_gpt();
  models::GPT plain(c), f8(c);
  f8.set_fp8(/*history=*/4, /*margin=*/0.0);
  EXPECT_TRUE(f8.fp8());
  EXPECT_EQ(f8.fp8_states().size(), 8u);
  EXPECT_EQ(f8.linear_names()[3], "h.0.mlp.c_proj");
  plain.train();
  f8.train();
  Generator g(3);
  Tensor x = randint(0, 64, {2, 16}, {DType::Int64, kCPU, false}, &g);
  Tensor l0 = plain.forward(x, x), l1 = f8.forward(x, x);
  l1.backward();
  EXPECT_NE(l0.item<float>(), l1.item<float>());
  for (const auto& st : f8.fp8_states()) {
    EXPECT_EQ(st.input.history().size(), 0u);
    EXPECT_GT(st.grad.pending(), 0.0);
  }
  f8.commit_fp8();
  for (const auto& st : f8.fp8_states()) {
    EXPECT_EQ(st.input.history().size(), 1u);
    EXPECT_EQ(st.weight.history().size(), 1u);
    EXPECT_EQ(st.grad.history().size(), 1u);
  }
  f8.eval();
  {
    autograd::NoGradGuard ng;
    f8.forward(x, x);
  }
  EXPECT_EQ(f8.fp8_states()[0].input.pending(), -1.0);
}

// Property: full recomputation runs each block's forward twice (once without grad, once in
// backward); the scales cannot change in between (they move at the commit) and the amaxes are
// noted once, so losses, gradients and the committed scalings equal those without
// recomputation, bitwise, over three steps of two micro-batches.
TEST(Fp8Ops, FullRecomputationMatchesBitwise) {
  const auto run = [](models::Recompute mode) {
    models::GPT m(small_gpt());
    m.set_fp8(/*history=*/2, 0.0, Fp8Recipe::E4M3);
    m.set_recompute({mode, -1});
    m.train();
    std::vector<float> out;
    for (uint64_t step = 0; step < 3; ++step) {
      for (uint64_t mb = 0; mb < 2; ++mb) {
        Generator g(10 * step + mb);
        Tensor x = randint(0, 64, {2, 16}, {DType::Int64, kCPU, false}, &g);
        Tensor loss = m.forward(x, x);
        out.push_back(loss.item<float>());
        mul(loss, 0.5).backward();
      }
      m.commit_fp8();
    }
    for (const auto& [name, p] : m.named_parameters()) {
      for (float v : to_vector<float>(p.grad())) out.push_back(v);
    }
    for (const auto& st : m.fp8_states()) {
      for (const Fp8Scaling* s : {&st.input, &st.weight, &st.grad}) {
        out.push_back(static_cast<float>(s->scale()));
      }
    }
    return out;
  };
  EXPECT_EQ(run(models::Recompute::Full), run(models::Recompute::Selective));
}
