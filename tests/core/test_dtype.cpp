#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "tardelli/tardelli.h"
#include "test_util.h"

using namespace td;

// bf16 rounds to nearest even and keeps NaN a NaN; f16 is IEEE half.
TEST(DType, HalfConversions) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1+2^-7: ties to even (1.0).
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 0x1p-8f)), 1.0f);
  // Just above halfway rounds up.
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
  EXPECT_EQ(static_cast<float>(BFloat16(INFINITY)), INFINITY);
  EXPECT_EQ(Float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(static_cast<float>(Float16(65504.0f)), 65504.0f);
  EXPECT_EQ(static_cast<float>(Float16(1e6f)), INFINITY);
}

TEST(DType, Promotion) {
  EXPECT_EQ(promote_types(DType::BFloat16, DType::Float16), DType::Float32);
  EXPECT_EQ(promote_types(DType::Int64, DType::BFloat16), DType::BFloat16);
  EXPECT_EQ(promote_types(DType::Int32, DType::Int64), DType::Int64);
  EXPECT_EQ(promote_types(DType::Bool, DType::Int32), DType::Int32);
  EXPECT_EQ(itemsize(DType::BFloat16), 2u);
  EXPECT_STREQ(dtype_name(DType::Float16), "float16");
}

// Property (Note [FP8 dtypes]): the float8 dtypes have torch's names, one byte per element, are
// not "floating" (no arithmetic, no autograd), and promote only with themselves: mixing them
// with any other dtype is an error naming both.
TEST(DType, Float8) {
  EXPECT_STREQ(dtype_name(DType::Float8E4M3FN), "float8_e4m3fn");
  EXPECT_STREQ(dtype_name(DType::Float8E5M2), "float8_e5m2");
  EXPECT_EQ(itemsize(DType::Float8E4M3FN), 1u);
  EXPECT_EQ(itemsize(DType::Float8E5M2), 1u);
  EXPECT_TRUE(is_float8(DType::Float8E4M3FN) && is_float8(DType::Float8E5M2));
  EXPECT_FALSE(is_float8(DType::BFloat16) || is_float8(DType::Bool));
  EXPECT_FALSE(is_floating(DType::Float8E4M3FN) || is_floating(DType::Float8E5M2));
  EXPECT_EQ(fp8_format_of(DType::Float8E4M3FN), Fp8Format::E4M3FN);
  EXPECT_EQ(fp8_format_of(DType::Float8E5M2), Fp8Format::E5M2);
  EXPECT_THROW(fp8_format_of(DType::Float32), Error);
  EXPECT_EQ(dtype_of<Float8E4M3FN>::value, DType::Float8E4M3FN);
  EXPECT_EQ(dtype_of<Float8E5M2>::value, DType::Float8E5M2);
  EXPECT_EQ(promote_types(DType::Float8E5M2, DType::Float8E5M2), DType::Float8E5M2);
  const DType all[] = {DType::Float32, DType::BFloat16, DType::Float16,      DType::Int32,
                       DType::Int64,   DType::Bool,     DType::Float8E4M3FN, DType::Float8E5M2};
  for (DType f8 : {DType::Float8E4M3FN, DType::Float8E5M2}) {
    for (DType other : all) {
      if (other == f8) continue;
      for (auto [a, b] : {std::pair{f8, other}, std::pair{other, f8}}) {
        const std::string msg = td::test::error_of([&] { promote_types(a, b); });
        EXPECT_NE(msg.find(std::string("promote_types: promotion between ") + dtype_name(a) +
                           " and " + dtype_name(b) + " is not supported"),
                  std::string::npos)
            << msg;
      }
    }
  }
}

// Conversions between every pair of dtypes round-trip small integers exactly.
TEST(DType, ConversionMatrix) {
  std::vector<DType> all = {DType::Float32, DType::BFloat16, DType::Float16,
                            DType::Int32,   DType::Int64,    DType::Bool};
  Tensor src = from_vector<float>({0, 1, 2, 3, 7, 0}, {2, 3});
  for (DType a : all) {
    for (DType b : all) {
      if (a == DType::Bool || b == DType::Bool) continue;
      Tensor r = src.to(a).to(b).to(DType::Float32);
      EXPECT_EQ(to_vector<float>(r), to_vector<float>(src)) << dtype_name(a) << "->" << dtype_name(b);
    }
  }
  Tensor bl = src.to(DType::Bool).to(DType::Int64);
  EXPECT_EQ(to_vector<int64_t>(bl), (std::vector<int64_t>{0, 1, 1, 1, 1, 0}));
}

TEST(Device, Parse) {
  EXPECT_EQ(Device::parse("cpu"), kCPU);
  EXPECT_EQ(Device::parse("cuda:3"), cuda_device(3));
  EXPECT_THROW(Device::parse("gpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
  // No CUDA backend in this build: allocating on CUDA is a clear error, not a crash.
  EXPECT_THROW(Tensor::empty({2}, DType::Float32, cuda_device(0)), Error);
}
