// apply_rotary / rotary_kernel on CUDA against the CPU backend.
// Tolerances: each output is x1*c - x2*s (or x2*c + x1*s) in fp32. The compilers may fuse one
// product into an FMA (g++ -march=x86-64-v3 and nvcc both contract, possibly differently), which
// changes the result by at most about one fp32 ulp of the products: 1e-6 absolute plus 1e-6
// relative covers it for |x| ~ 1. bf16/fp16 outputs are rounded from those fp32 values, so a value
// that falls next to a rounding boundary can differ by one ulp of the 8-bit (bf16) mantissa:
// 1e-2 relative.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

double atol_of(DType dt) {
  return dt == DType::Float32 ? 1e-6 : 1e-2;
}
double rtol_of(DType dt) {
  return dt == DType::Float32 ? 1e-6 : 1e-2;
}

void expect_matches(const Tensor& cuda_result, const Tensor& cpu_result, DType dt,
                    const std::string& what) {
  ASSERT_TRUE(cuda_result.is_cuda()) << what;
  ASSERT_EQ(cuda_result.sizes(), cpu_result.sizes()) << what;
  ASSERT_EQ(cuda_result.dtype(), cpu_result.dtype()) << what;
  EXPECT_TRUE(cuda_result.is_contiguous()) << what;
  expect_close(doubles(on_cpu(cuda_result)), doubles(cpu_result), atol_of(dt), rtol_of(dt), what);
}

}  // namespace

TEST(RotaryCuda, ForwardAndInverseMatchCpu) {
  TD_REQUIRE_CUDA();
  const Shape shapes[] = {
      {2, 5, 3, 8}, {1, 1, 1, 2}, {3, 17, 4, 64}, {2, 7, 2, 130}, {1, 300, 2, 6}};
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (const Shape& s : shapes) {
      auto [c, sn] = rope_cache(s[1], s[3], 10000.0, 3);
      Tensor x = randn_seeded(s, 7 + s[1], dt);
      Tensor xc = on_cuda(x), cc = on_cuda(c), sc = on_cuda(sn);
      for (bool inverse : {false, true}) {
        std::string what =
            std::string(dtype_name(dt)) + " " + shape_str(s) + (inverse ? " inverse" : " forward");
        expect_matches(rotary_kernel(xc, cc, sc, inverse), rotary_kernel(x, c, sn, inverse), dt,
                       what);
      }
    }
  }
}

TEST(RotaryCuda, InverseUndoesForward) {
  TD_REQUIRE_CUDA();
  auto [c, s] = rope_cache(9, 16);
  Tensor x = on_cuda(randn_seeded({2, 9, 3, 16}, 5));
  Tensor cc = on_cuda(c), sc = on_cuda(s);
  Tensor back = rotary_kernel(rotary_kernel(x, cc, sc, false), cc, sc, true);
  expect_close(doubles(on_cpu(back)), doubles(on_cpu(x)), 1e-5, 1e-5, "roundtrip");
}

TEST(RotaryCuda, StridedInputs) {
  TD_REQUIRE_CUDA();
  const int64_t B = 2, T = 6, H = 3, D = 10;
  auto [c, s] = rope_cache(T, D);
  Tensor cc = on_cuda(c), sc = on_cuda(s);
  // q out of a fused QKV projection: [B, T, 3*H*D] narrowed and viewed (row stride 3*H*D).
  Tensor qkv = randn_seeded({B, T, 3 * H * D}, 11);
  Tensor q = qkv.narrow(2, H * D, H * D).view({B, T, H, D});
  Tensor q_cuda = on_cuda(qkv).narrow(2, H * D, H * D).view({B, T, H, D});
  ASSERT_FALSE(q_cuda.is_contiguous());
  expect_matches(rotary_kernel(q_cuda, cc, sc, false), rotary_kernel(q, c, s, false),
                 DType::Float32, "qkv view");
  // Head dim not unit-stride: transpose of a [B, T, D, H] tensor.
  Tensor y = randn_seeded({B, T, D, H}, 12);
  expect_matches(rotary_kernel(on_cuda(y).transpose(2, 3), cc, sc, false),
                 rotary_kernel(y.transpose(2, 3), c, s, false), DType::Float32, "transposed");
  // cos/sin narrowed to a window of a longer cache (as the GPT model does).
  auto [c_long, s_long] = rope_cache(20, D);
  Tensor cw = c_long.narrow(0, 4, T), sw = s_long.narrow(0, 4, T);
  Tensor x = randn_seeded({B, T, H, D}, 13);
  expect_matches(rotary_kernel(on_cuda(x), on_cuda(c_long).narrow(0, 4, T),
                               on_cuda(s_long).narrow(0, 4, T), false),
                 rotary_kernel(x, cw, sw, false), DType::Float32, "cache window");
}

TEST(RotaryCuda, AutogradMatchesCpu) {
  TD_REQUIRE_CUDA();
  const Shape s{2, 5, 4, 12};
  auto [c, sn] = rope_cache(5, 12);
  Tensor x_cpu = randn_seeded(s, 21);
  x_cpu.set_requires_grad(true);
  Tensor x_cuda = on_cuda(randn_seeded(s, 21));
  x_cuda.set_requires_grad(true);
  Tensor g = randn_seeded(s, 22);
  apply_rotary(x_cpu, c, sn).backward(g);
  apply_rotary(x_cuda, on_cuda(c), on_cuda(sn)).backward(on_cuda(g));
  ASSERT_TRUE(x_cuda.grad().defined());
  expect_matches(x_cuda.grad(), x_cpu.grad(), DType::Float32, "grad");
}

TEST(RotaryCuda, Empty) {
  TD_REQUIRE_CUDA();
  auto [c, s] = rope_cache(4, 8);
  Tensor out = apply_rotary(on_cuda(Tensor::empty({0, 4, 2, 8})), on_cuda(c), on_cuda(s));
  EXPECT_EQ(out.sizes(), (Shape{0, 4, 2, 8}));
  EXPECT_TRUE(out.is_cuda());
}

TEST(RotaryCuda, BadInputsRaise) {
  TD_REQUIRE_CUDA();
  const std::pair<Tensor, Tensor> cache = rope_cache(4, 8);
  const Tensor c = cache.first, s = cache.second;
  Tensor x = on_cuda(randn_seeded({1, 4, 2, 8}, 1));
  // cos/sin left on the CPU.
  EXPECT_NE(error_of([&] { apply_rotary(x, c, s); }).find("apply_rotary"), std::string::npos);
  EXPECT_THROW(apply_rotary(x, on_cuda(c), s), Error);
  // Wrong cache length, odd head dim, 3-D x, fp16 cache.
  auto [c5, s5] = rope_cache(5, 8);
  EXPECT_THROW(apply_rotary(x, on_cuda(c5), on_cuda(s5)), Error);
  EXPECT_THROW(apply_rotary(on_cuda(randn_seeded({1, 4, 2, 7}, 2)), on_cuda(c), on_cuda(s)), Error);
  EXPECT_THROW(apply_rotary(on_cuda(randn_seeded({4, 2, 8}, 3)), on_cuda(c), on_cuda(s)), Error);
  EXPECT_THROW(apply_rotary(x, on_cuda(c.to(DType::Float16)), on_cuda(s.to(DType::Float16))),
               Error);
}
