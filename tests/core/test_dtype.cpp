#include <gtest/gtest.h>

#include <cmath>

#include "tardelli/tardelli.h"

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
