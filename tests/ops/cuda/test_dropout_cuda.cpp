// dropout on CUDA against the CPU backend: both draw the mask from the same Philox stream
// (core/rng.h) and scale kept values with one fp32 multiply, so the outputs are bitwise equal
// for the same generator state, for every size, p and dtype.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

// Nonzero inputs, so a zero output means "dropped".
Tensor nonzero_input(const Shape& shape, uint64_t seed, DType dt = DType::Float32) {
  Generator gen(seed);
  Tensor t = add(rand(shape, {}, &gen), 0.5);
  return dt == DType::Float32 ? t : t.to(dt);
}

}  // namespace

TEST(DropoutCuda, MaskMatchesCpuBitwise) {
  TD_REQUIRE_CUDA();
  // States with a counter above 2^32 and a nonzero subsequence exercise every word of the
  // Philox counter and key.
  const PhiloxState states[] = {
      {1234, 0, 0}, {0xDEADBEEFCAFEULL, (1ULL << 32) - 3, 7}, {42, 12345, 0x9E3779B97F4A7C15ULL}};
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 1023, 4097, (1 << 20) + 3}) {
      Tensor x = nonzero_input({n}, 100 + n, dt);
      Tensor xc = on_cuda(x);
      for (double p : {0.0, 0.1, 0.5, 1.0}) {
        for (const PhiloxState& st : states) {
          std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n) +
                             " p=" + std::to_string(p) + " offset=" + std::to_string(st.offset);
          Tensor got = dropout_apply(xc, p, st);
          ASSERT_TRUE(got.is_cuda());
          EXPECT_TRUE(same_bytes(on_cpu(got), dropout_apply(x, p, st))) << what;
        }
      }
    }
  }
}

TEST(DropoutCuda, NonContiguousAndMisalignedInputs) {
  TD_REQUIRE_CUDA();
  const PhiloxState st{77, 5, 1};
  // Transposed: the mask follows the logical (row-major) order, as on the CPU.
  Tensor x = nonzero_input({13, 9}, 1);
  EXPECT_TRUE(same_bytes(on_cpu(dropout_apply(on_cuda(x).transpose(0, 1), 0.3, st)),
                         dropout_apply(x.transpose(0, 1), 0.3, st)));
  // A view starting one element in: no 16-byte vectors.
  Tensor big = nonzero_input({1001}, 2);
  EXPECT_TRUE(same_bytes(on_cpu(dropout_apply(on_cuda(big).narrow(0, 1, 1000), 0.3, st)),
                         dropout_apply(big.narrow(0, 1, 1000), 0.3, st)));
}

TEST(DropoutCuda, GeneratorPathAndBackwardMatchCpu) {
  TD_REQUIRE_CUDA();
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (double p : {0.1, 0.5, 1.0}) {
      Generator gen_cpu(2024, 3), gen_cuda(2024, 3);
      Tensor x_cpu = nonzero_input({6, 37}, 9, dt);
      x_cpu.set_requires_grad(true);
      Tensor x_cuda = on_cuda(nonzero_input({6, 37}, 9, dt));
      x_cuda.set_requires_grad(true);
      // Two draws each: the generators advance alike.
      for (int draw = 0; draw < 2; ++draw) {
        Tensor y_cpu = dropout(x_cpu, p, true, &gen_cpu);
        Tensor y_cuda = dropout(x_cuda, p, true, &gen_cuda);
        EXPECT_TRUE(same_bytes(on_cpu(y_cuda), y_cpu)) << dtype_name(dt) << " p=" << p;
        EXPECT_EQ(gen_cpu.offset(), gen_cuda.offset());
      }
      Tensor y_cpu = dropout(x_cpu, p, true, &gen_cpu);
      Tensor y_cuda = dropout(x_cuda, p, true, &gen_cuda);
      Tensor g = randn_seeded({6, 37}, 10, dt);
      y_cpu.backward(g);
      y_cuda.backward(on_cuda(g));
      ASSERT_TRUE(x_cuda.grad().defined());
      EXPECT_TRUE(same_bytes(on_cpu(x_cuda.grad()), x_cpu.grad())) << dtype_name(dt) << " p=" << p;
    }
  }
}

TEST(DropoutCuda, IdentityCasesAndEmpty) {
  TD_REQUIRE_CUDA();
  Tensor x = on_cuda(nonzero_input({5, 3}, 4));
  EXPECT_TRUE(dropout(x, 0.0).is_same(x));
  EXPECT_TRUE(dropout(x, 0.7, false).is_same(x));
  Tensor e = dropout(on_cuda(Tensor::empty({0, 3})), 0.5);
  EXPECT_EQ(e.sizes(), (Shape{0, 3}));
  EXPECT_TRUE(e.is_cuda());
}

TEST(DropoutCuda, BadInputsRaise) {
  TD_REQUIRE_CUDA();
  Tensor x = on_cuda(nonzero_input({4}, 1));
  EXPECT_NE(error_of([&] { dropout(x, 1.5); }).find("dropout"), std::string::npos);
  EXPECT_THROW(dropout(x, -0.1), Error);
  EXPECT_THROW(dropout_apply(x, 2.0, PhiloxState{}), Error);
  EXPECT_THROW(dropout(on_cuda(from_vector<int64_t>({1, 2}, {2})), 0.5), Error);
}
