// The blocked transposing copy (Note [Transposed copies], src/ops/cpu/transpose.cpp) must move
// exactly the bytes the generic strided copy would: every destination element equals the source
// element at the same logical index. The expectation is computed here from the source view's
// raw storage and strides, independently of any copy routine, and compared bytewise.
#include <gtest/gtest.h>

#include <cstring>

#include "tardelli/tardelli.h"

using namespace td;

namespace {

// Source of distinct bit patterns for every element (random bits, any dtype).
Tensor random_bits(const Shape& s, DType dt) {
  Tensor t = Tensor::empty(s, dt);
  Tensor bytes = randint(0, 256, {static_cast<int64_t>(t.nbytes())}, {DType::Int32});
  std::vector<int32_t> b = to_vector<int32_t>(bytes);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < b.size(); ++i) p[i] = static_cast<uint8_t>(b[i]);
  return t;
}

// dst (contiguous, shape of view) must hold view's elements in row-major order of the shape.
void expect_same_elements(const Tensor& dst, const Tensor& view, const char* what) {
  ASSERT_TRUE(dst.is_contiguous());
  const size_t es = view.element_size();
  const auto* base = static_cast<const uint8_t*>(view.data_ptr());
  const auto* out = static_cast<const uint8_t*>(dst.data_ptr());
  const int64_t nd = view.dim();
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t bad = 0;
  for (int64_t flat = 0; flat < dst.numel(); ++flat) {
    int64_t off = 0;
    for (int64_t k = 0; k < nd; ++k) off += idx[k] * view.stride(k);
    if (std::memcmp(out + flat * es, base + off * static_cast<int64_t>(es), es) != 0) ++bad;
    for (int64_t k = nd - 1; k >= 0; --k) {
      if (++idx[k] < view.size(k)) break;
      idx[k] = 0;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << dst.numel() << " elements differ";
}

}  // namespace

// 2-D transposes of every element size, at sizes that are and are not multiples of the 8 x 8
// register tile and the 256 x 32 work block (and one below the kernel's size threshold).
TEST(TransposeCopy, MatchesElementMappingAllDtypes) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4, 9}, {64, 64}, {8, 1024}, {1024, 8}, {67, 133}, {129, 65}, {513, 9}, {2048, 257}};
  for (DType dt :
       {DType::Float32, DType::Int32, DType::BFloat16, DType::Float16, DType::Int64, DType::Bool}) {
    for (auto [r, c] : shapes) {
      Tensor x = random_bits({r, c}, dt == DType::Bool ? DType::Int32 : dt);
      if (dt == DType::Bool) x = ne(x, 0.0);  // bool bytes must stay 0/1
      Tensor v = x.t();
      Tensor out = Tensor::empty(v.sizes(), dt);
      copy_into(out, v);
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << r << "x" << c);
      expect_same_elements(out, v, "transpose");
    }
  }
}

// Batched and higher-rank permutations: the planes are any two dims, the batch any others,
// including a permuted batch, a non-contiguous destination and an offset view.
TEST(TransposeCopy, BatchedPermutations) {
  Tensor x = randn({3, 40, 5, 72});
  const std::vector<std::vector<int64_t>> perms = {
      {0, 3, 2, 1}, {3, 0, 2, 1}, {2, 3, 1, 0}, {1, 3, 0, 2}, {0, 2, 3, 1}};
  for (const auto& p : perms) {
    Tensor v = x.permute(p);
    Tensor out = Tensor::empty(v.sizes());
    copy_into(out, v);
    SCOPED_TRACE(testing::Message() << "permute " << p[0] << p[1] << p[2] << p[3]);
    expect_same_elements(out, v, "permute");
  }
  // An offset source (narrowed) and a destination that is itself a column slice.
  Tensor src = randn({300, 200}).narrow(0, 7, 250).narrow(1, 3, 150).t();  // [150, 250]
  Tensor wide = zeros({150, 260});
  Tensor dst = wide.narrow(1, 5, 250);
  copy_into(dst, src);
  Tensor packed = contiguous(dst);
  expect_same_elements(packed, src, "offset source into a column slice");
  // The columns outside the slice are untouched.
  EXPECT_EQ(sum(abs(wide.narrow(1, 0, 5))).item<float>(), 0.0f);
  EXPECT_EQ(sum(abs(wide.narrow(1, 255, 5))).item<float>(), 0.0f);
}
