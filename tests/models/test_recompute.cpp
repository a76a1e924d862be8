// Activation recomputation in the fused GPT (models/recompute.h, Note [Recompute modes]): the
// mode changes what a block keeps, never a value or a gradient. Checked here: bitwise equal
// losses and gradients for every mode (dropout on, gradient accumulation, gpt2 and llama), the
// per-block memory formulas of the Note measured with the allocator, the peak of full
// recomputation (about one activation per block), and the option's errors. Multi-rank layouts
// (tp, sp, pp schedules, dp) are tests/python/test_train_recompute.py.
#include <gtest/gtest.h>

#include <map>

#include "tardelli/models/gpt.h"
#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;
using td::models::Arch;
using td::models::GPT;
using td::models::GPTConfig;
using td::models::Recompute;
using td::models::RecomputeOptions;
using td::test::error_of;

namespace {

GPTConfig config(Arch arch, int64_t layers, double dropout) {
  GPTConfig c;
  c.arch = arch;
  c.vocab_size = 97;
  c.block_size = 32;
  c.n_layer = layers;
  c.n_head = 4;
  c.n_kv_head = arch == Arch::Llama ? 2 : 0;
  c.d_model = 32;
  c.dropout = dropout;
  c.seed = 11;
  return c;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, {DType::Int64, kCPU, false}, &g);
}

struct Result {
  std::vector<std::vector<float>> losses;
  std::map<std::string, std::vector<float>> grads;
  uint64_t dropout_offset = 0;
};

// Two micro-batches of gradient accumulation (loss / 2 each), training mode.
Result train_step(Arch arch, RecomputeOptions r) {
  GPT m(config(arch, 3, 0.1));
  m.set_recompute(r);
  m.train(true);
  Result res;
  for (uint64_t mb = 0; mb < 2; ++mb) {
    Tensor loss = m.forward(tokens(2, 32, 97, 1 + mb), tokens(2, 32, 97, 5 + mb));
    res.losses.push_back(to_vector<float>(loss));
    mul(loss, 0.5).backward();
  }
  for (auto& [n, p] : m.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << n;
    if (p.grad().defined()) res.grads[n] = to_vector<float>(p.grad());
  }
  res.dropout_offset = m.dropout_generator().offset();
  return res;
}

}  // namespace

// Property: none, selective, full and full on the first block only give the same two losses and
// every parameter gradient bit for bit (fp32, dropout 0.1 on embeddings and both residual
// branches, so the recomputation must replay the masks), and leave the dropout stream at the
// same offset.
TEST(GPTRecompute, GradientsBitwiseEqualAcrossModes) {
  for (Arch arch : {Arch::GPT2, Arch::Llama}) {
    const Result ref = train_step(arch, {Recompute::Selective, -1});
    const std::vector<std::pair<const char*, RecomputeOptions>> modes = {
        {"none", {Recompute::None, -1}},
        {"full", {Recompute::Full, -1}},
        {"full, 1 layer", {Recompute::Full, 1}}};
    for (const auto& [name, opts] : modes) {
      SCOPED_TRACE(std::string(models::arch_name(arch)) + " " + name);
      const Result got = train_step(arch, opts);
      EXPECT_EQ(got.losses, ref.losses);
      EXPECT_EQ(got.dropout_offset, ref.dropout_offset);
      ASSERT_EQ(got.grads.size(), ref.grads.size());
      for (const auto& [n, g] : ref.grads) EXPECT_EQ(got.grads.at(n), g) << n;
    }
  }
}

namespace {

// Bytes held after a training forward (the graph alive, before backward), for a model of
// `layers` layers: what the blocks keep plus a part that does not depend on the layer count.
int64_t held_after_forward(const GPTConfig& c, RecomputeOptions r, int64_t B) {
  GPT m(c);
  m.set_recompute(r);
  m.train(true);
  Tensor idx = tokens(B, c.block_size, c.vocab_size, 3),
         tgt = tokens(B, c.block_size, c.vocab_size, 4);
  const int64_t before = memory_stats().current_bytes;
  Tensor loss = m.forward(idx, tgt);
  return memory_stats().current_bytes - before;
}

// The formulas of Note [Recompute modes], bytes per token per block (fp32: s = 4).
int64_t per_token_formula(const GPTConfig& c, Recompute mode) {
  const int64_t s = 4, d = c.d_model, hd = c.head_dim(), A = c.n_head * hd;
  const int64_t K = c.kv_heads() * hd, ff = models::ffn_hidden_size(c), H = c.n_head;
  const bool gpt2 = c.arch == Arch::GPT2;
  if (mode == Recompute::Full) return s * d;
  int64_t b =
      gpt2 ? s * (10 * d + ff) + 4 * (4 + H) : s * (6 * d + 3 * A + 3 * K + 2 * ff) + 4 * (2 + H);
  if (mode == Recompute::None) b += s * (gpt2 ? ff : 2 * ff);
  return b;
}

}  // namespace

// Property: what a block keeps between forward and backward is the Note's formula: the bytes
// held after the forward of a 4-layer model minus a 2-layer one, over 2 blocks and B*T tokens,
// equal the formula to within 1% (allocation rounding: 64-byte alignment of ~20 tensors per
// block), for every mode and both archs, with dropout on. If an op starts keeping another
// tensor, or the MLP activation is stored under selective, this fails.
TEST(GPTRecompute, PerBlockMemoryMatchesFormula) {
  for (Arch arch : {Arch::GPT2, Arch::Llama}) {
    for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      SCOPED_TRACE(std::string(models::arch_name(arch)) + " " + models::recompute_name(mode));
      GPTConfig c4 = config(arch, 4, 0.1), c2 = config(arch, 2, 0.1);
      c4.block_size = c2.block_size = 64;
      const int64_t B = 4, tokens_n = B * c4.block_size;
      const int64_t per_block =
          (held_after_forward(c4, {mode, -1}, B) - held_after_forward(c2, {mode, -1}, B)) / 2;
      const int64_t want = per_token_formula(c4, mode) * tokens_n;
      EXPECT_NEAR(static_cast<double>(per_block), static_cast<double>(want), 0.01 * want)
          << "measured " << per_block << " bytes per block, formula " << want;
    }
  }
}

// Property: under full recomputation the step's peak grows by about one activation [B, T, d] per
// extra block (the kept input), not by the selective set (14 d per token for gpt2): the peak of
// a 5-layer model minus a 2-layer one is at most 3 inputs + 4% (+64 KiB for rounding), while for
// selective it is at least 95% of 3 times the selective formula's bytes (measured: exactly it).
// Gradients are allocated by a first step, so the measured step allocates no .grad.
TEST(GPTRecompute, FullRecomputePeakIsOneActivationPerBlock) {
  auto peak = [](int64_t layers, Recompute mode) {
    GPTConfig c = config(Arch::GPT2, layers, 0.0);
    c.block_size = 128;
    c.d_model = 64;
    GPT m(c);
    m.set_recompute({mode, -1});
    Tensor idx = tokens(4, 128, c.vocab_size, 3), tgt = tokens(4, 128, c.vocab_size, 4);
    m.forward(idx, tgt).backward();  // allocates every .grad
    reset_peak_memory_stats();
    const int64_t base = memory_stats().current_bytes;
    m.forward(idx, tgt).backward();
    return memory_stats().peak_bytes - base;
  };
  const GPTConfig c = [] {
    GPTConfig x = config(Arch::GPT2, 2, 0.0);
    x.d_model = 64;
    return x;
  }();
  const int64_t N = 4 * 128, act = 4 * c.d_model * N;
  const int64_t full = peak(5, Recompute::Full) - peak(2, Recompute::Full);
  EXPECT_LE(full, 3 * act + act / 25 + 64 * 1024) << "3 extra blocks added " << full << " bytes";
  const int64_t sel = peak(5, Recompute::Selective) - peak(2, Recompute::Selective);
  EXPECT_GE(sel, 0.95 * static_cast<double>(3 * per_token_formula(c, Recompute::Selective) * N))
      << "3 extra blocks added " << sel << " bytes";
}

// Property: the option's bad values are td::Errors naming the problem; a stage's layer count is
// the bound for num_layers.
TEST(GPTRecompute, BadOptions) {
  GPT m(config(Arch::GPT2, 3, 0.0));
  EXPECT_NE(error_of([&] {
              m.set_recompute({Recompute::Full, 4});
            }).find("this stage holds 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              m.set_recompute({Recompute::Full, 0});
            }).find("must be in [1, 3]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              m.set_recompute({Recompute::Selective, 1});
            }).find("applies to recompute 'full' only"),
            std::string::npos);
  EXPECT_NE(error_of([] { models::parse_recompute("partial"); }).find("unknown mode 'partial'"),
            std::string::npos);
  GPT stage(config(Arch::GPT2, 4, 0.0), models::GPTStage{2, 2, false, true});
  EXPECT_NE(error_of([&] {
              stage.set_recompute({Recompute::Full, 3});
            }).find("h.2..h.3"),
            std::string::npos);
  stage.set_recompute({Recompute::Full, 2});
  EXPECT_EQ(stage.recompute().num_layers, 2);
}
