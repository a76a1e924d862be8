// Context-parallel attention (include/tardelli/parallel/context_parallel.h) at 2 and 4 ranks,
// cp = the world.
//
// Every rank draws the same FULL q, k, v [B, H, T, D] and output gradient G from one seed and
// computes single-device flash attention on the whole sequence (the reference) and its
// gradients for loss = sum(out * G). Then each rank takes its zigzag tokens of q, k, v as leaves,
// runs context_parallel_attention and backpropagates sum(out_local * G_local): the ranks' local
// losses add up to the reference loss, so each rank's out, dq, dk and dv must equal its zigzag
// slice of the reference ones.
//
// Tolerance (fp32, inputs ~N(0,1)): 2e-5 of the largest reference magnitude. The parallel result
// is the same math in another order: the softmax is split over up to 2 x cp key blocks and
// recombined with exp(lse_i - lse) weights (a few ulps each), and dk/dv are sums over query
// blocks added in ring order instead of the kernel's order; with at most a few hundred terms
// per sum that is ~1e-6 relative, well below 2e-5, while any wrong mask, wrong chunk or missing
// block changes values by O(1e-2) or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/ops/attention.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/parallel/context_parallel.h"

#include "distributed/parallel_test_util.h"

namespace td::parallel {
namespace {

using namespace td::parallel_test;

using distributed::CommPtr;

CommPtr cp_group() {
  static CommPtr w = distributed::mpi_world();  // cp = the whole world
  return w;
}

constexpr double kRel = 2e-5;

struct Case {
  std::string name;
  int64_t B, H, Hkv, T, D;
};

// Runs one case at this world size; `modes` are the comm modes to check.
void check_case(const Case& c, bool causal, CPComm mode) {
  const CommPtr cp = cp_group();
  const int N = cp->size(), r = cp->rank();
  const std::string tag = c.name + (causal ? " causal " : " full ") + cp_comm_name(mode) +
                          " cp=" + std::to_string(N) + " rank " + std::to_string(r) + ": ";
  Tensor q = leaf(full_randn({c.B, c.H, c.T, c.D}, 11));
  Tensor k = leaf(full_randn({c.B, c.Hkv, c.T, c.D}, 12));
  Tensor v = leaf(full_randn({c.B, c.Hkv, c.T, c.D}, 13));
  Tensor G = full_randn({c.B, c.H, c.T, c.D}, 14);
  Tensor ref = scaled_dot_product_attention(q, k, v, Tensor(), causal);
  sum(mul(ref, G)).backward();

  auto zz = [&](const Tensor& t) { return zigzag_slice(t, 2, r, N); };
  Tensor ql = leaf(zz(q)), kl = leaf(zz(k)), vl = leaf(zz(v));
  Tensor out = context_parallel_attention(ql, kl, vl, cp, causal, mode);
  sum(mul(out, zz(G))).backward();
  expect_close(out, zz(ref), kRel, tag + "out");
  expect_close(ql.grad(), zz(q.grad()), kRel, tag + "dq");
  expect_close(kl.grad(), zz(k.grad()), kRel, tag + "dk");
  expect_close(vl.grad(), zz(v.grad()), kRel, tag + "dv");
}

void check_all(const Case& c) {
  const int N = cp_group()->size();
  for (bool causal : {true, false}) {
    check_case(c, causal, CPComm::Ring);
    if (c.H % N == 0 && c.Hkv % N == 0) check_case(c, causal, CPComm::AllToAll);
  }
}

TEST(ContextParallelAttention, Gpt2Shapes) {
  check_all({"gpt2", 2, 4, 4, 32, 16});
}

TEST(ContextParallelAttention, GroupedQueryHeads) {
  check_all({"gqa", 1, 8, 4, 24, 8});
  check_all({"gqa 6/2", 1, 6, 2, 16, 8});  // ring only at cp 4 (a2a needs heads % 4)
}

TEST(ContextParallelAttention, OddHeadDim) {
  check_all({"odd hd", 1, 4, 2, 40, 13});
}

// Local lengths above the kernel's 64-row blocks (partial blocks on both sides).
TEST(ContextParallelAttention, LongSequence) {
  check_all({"long mqa", 1, 2, 1, 272, 8});
  check_all({"long", 1, 4, 4, 272, 8});
}

TEST(ContextParallelAttention, ReducedPrecisionRunsInFp32Accumulators) {
  // bf16 inputs: the ring accumulates in fp32; compare with the bf16 single-device result at
  // bf16 resolution (2^-8 relative per value, outputs are averages of O(1) values).
  const CommPtr cp = cp_group();
  const int N = cp->size(), r = cp->rank();
  Tensor q = full_randn({1, 2, 32, 8}, 21).to(DType::BFloat16);
  Tensor k = full_randn({1, 2, 32, 8}, 22).to(DType::BFloat16);
  Tensor v = full_randn({1, 2, 32, 8}, 23).to(DType::BFloat16);
  Tensor ref = scaled_dot_product_attention(q, k, v, Tensor(), true).to(DType::Float32);
  Tensor out = context_parallel_attention(zigzag_slice(q, 2, r, N), zigzag_slice(k, 2, r, N),
                                          zigzag_slice(v, 2, r, N), cp, true, CPComm::Ring);
  ASSERT_EQ(out.dtype(), DType::BFloat16);
  expect_close(out.to(DType::Float32), zigzag_slice(ref, 2, r, N), 2e-2, "bf16 out");
}

TEST(ContextParallelZigzag, PositionsSliceAndGather) {
  const CommPtr cp = cp_group();
  const int N = cp->size(), r = cp->rank();
  const int64_t T = 4 * N, c = 2;
  std::vector<int64_t> pos = zigzag_positions(T, r, N);
  std::vector<int64_t> want;
  for (int64_t t = 0; t < c; ++t) want.push_back(r * c + t);
  for (int64_t t = 0; t < c; ++t) want.push_back((2 * N - 1 - r) * c + t);
  EXPECT_EQ(pos, want);
  Tensor x = full_randn({2, T, 3}, 5);
  Tensor local = zigzag_slice(x, 1, r, N);
  ASSERT_EQ(local.sizes(), Shape({2, 2 * c, 3}));
  // The slice holds the rows at the zigzag positions.
  std::vector<float> xv = to_vector<float>(x), lv = to_vector<float>(local);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 2 * c; ++i)
      for (int64_t d = 0; d < 3; ++d)
        EXPECT_EQ(lv[(b * 2 * c + i) * 3 + d], xv[(b * T + pos[i]) * 3 + d]);
  expect_close(zigzag_gather(local, cp, 1), x, 0.0, "gather");
}

TEST(ContextParallelErrors, SequenceNotDivisibleByTwiceCp) {
  const CommPtr cp = cp_group();
  const int N = cp->size();
  const int64_t T = 2 * N + 2;  // divisible by 2, not by 2N (N >= 2)
  try {
    zigzag_positions(T, cp->rank(), N);
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by 2 x cp"), std::string::npos) << e.what();
  }
  EXPECT_THROW(zigzag_slice(zeros({1, T}), 1, cp->rank(), N), Error);
  // An odd local length cannot be two zigzag chunks.
  Tensor q = zeros({1, 2, 3, 4});
  try {
    context_parallel_attention(q, q, q, cp, true, CPComm::Ring);
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("context_parallel_attention"), std::string::npos) << m;
    EXPECT_NE(m.find("must be even"), std::string::npos) << m;
    EXPECT_NE(m.find("rank " + std::to_string(cp->rank())), std::string::npos) << m;
  }
}

TEST(ContextParallelErrors, AllToAllHeadsNotDivisible) {
  const CommPtr cp = cp_group();
  const int64_t H = cp->size() + 1;  // never divisible by cp >= 2
  Tensor q = zeros({1, H, 4, 4});
  try {
    context_parallel_attention(q, q, q, cp, true, CPComm::AllToAll);
    FAIL() << "expected td::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cp_comm=a2a"), std::string::npos) << m;
    EXPECT_NE(m.find("divisible by cp"), std::string::npos) << m;
  }
  // GQA: query heads divisible, kv heads not.
  const int N = cp->size();
  Tensor qg = zeros({1, 2 * N, 4, 4}), kg = zeros({1, 1, 4, 4});
  EXPECT_THROW(context_parallel_attention(qg, kg, kg, cp, true, CPComm::AllToAll), Error);
  EXPECT_THROW(parse_cp_comm("ulysses"), Error);
}

}  // namespace
}  // namespace td::parallel
