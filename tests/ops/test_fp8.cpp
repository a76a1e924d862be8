// FP8 linear layers emulated on the CPU (ops/fp8.h): Note [FP8 emulation], Note [FP8 scaling].
//
// Properties: fake quantization is the elementwise fp8 round trip of x * s, divided by s; the
// FP8 linear's forward and its three gradients equal the same products computed here from the
// quantized operands (the same ops, so exactly); the gradient is quantized in E5M2 and the bias
// gradient is the unquantized sum; delayed scaling uses the history's largest amax, current
// scaling this tensor's, both by the formula fp8_max / amax / 2^margin. Equalities are exact.
#include "tardelli/ops/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tardelli/autograd/engine.h"
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

// Property: GPT::set_fp8 routes the blocks' four linears through fp8_linear: a training step
// changes the loss against the same model without FP8 (quantization) and fills every linear's
// amax history; an evaluation forward records nothing; full recomputation is refused.
TEST(Fp8Ops, GptBlocksUseFp8Linears) {
  models::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 32;
  models::GPT plain(c), f8(c);
  f8.set_fp8(/*history=*/4, /*margin=*/0.0);
  EXPECT_TRUE(f8.fp8());
  EXPECT_EQ(f8.fp8_states().size(), 8u);
  plain.train();
  f8.train();
  Generator g(3);
  Tensor x = randint(0, 64, {2, 16}, {DType::Int64, kCPU, false}, &g);
  Tensor l0 = plain.forward(x, x), l1 = f8.forward(x, x);
  l1.backward();
  EXPECT_NE(l0.item<float>(), l1.item<float>());
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
  EXPECT_EQ(f8.fp8_states()[0].input.history().size(), 1u);
  EXPECT_NE(td::test::error_of([&] {
              f8.set_recompute({models::Recompute::Full, -1});
            }).find("full recomputation with FP8"),
            std::string::npos);
}
