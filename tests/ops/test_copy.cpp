// Copies and conversions of the float8 dtypes (Note [FP8 dtypes] in core/dtype.h): Tensor::to,
// copy_ and to_fp8 against the scalar conversions of core/fp8.h (themselves checked against the
// OCP spec and a brute-force reference in tests/core/test_fp8.cpp), the ops that only move
// bytes, and the clear refusal of arithmetic. Every comparison is exact, on codes or float bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tardelli/tardelli.h"
#include "test_util.h"

namespace {

using namespace td;

constexpr DType kF8[] = {DType::Float8E4M3FN, DType::Float8E5M2};

Tensor from_codes(const std::vector<uint8_t>& codes, DType dt, const Shape& sizes) {
  Tensor t = Tensor::empty(sizes, dt);
  EXPECT_EQ(static_cast<size_t>(t.numel()), codes.size());
  if (!codes.empty()) std::memcpy(t.data_ptr(), codes.data(), codes.size());
  return t;
}

Tensor all_codes(DType dt) {
  std::vector<uint8_t> c(256);
  for (int i = 0; i < 256; ++i) c[i] = static_cast<uint8_t>(i);
  return from_codes(c, dt, {16, 16});
}

std::vector<uint8_t> codes_of(const Tensor& t) {
  EXPECT_TRUE(is_float8(t.dtype()));
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel());
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// Equal floats, bit for bit; any NaN equals a NaN of the same sign.
bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) {
    return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  }
  return bits(a) == bits(b);
}

// Values every conversion meets: zeros, +-max, the rounding ties and overflow thresholds of
// both formats, subnormals (fp8 and float), infinities, NaNs, and random magnitudes over every
// binade of both formats.
std::vector<float> probe_values() {
  std::vector<float> v = {0.f,      -0.f,      1.f,          -1.f,     448.f,    -449.f,
                          464.f,    465.f,     -480.f,       57344.f,  61439.f,  61440.f,
                          -1e6f,    INFINITY,  -INFINITY,    NAN,      -NAN,     0x1p-9f,
                          0x1p-10f, -0x1p-10f, 3 * 0x1p-11f, 0x1p-16f, 0x1p-17f, 3 * 0x1p-18f,
                          1e-30f,   -1e-40f,   0.3f,         -2.5f,    1.125f,   1.0625f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> logu(-20.0, 17.0);
  for (int i = 0; i < 4000; ++i) {
    v.push_back(static_cast<float>(std::exp2(logu(rng)) * ((rng() & 1) ? 1 : -1)));
  }
  return v;
}

// Property: every one of the 256 codes of both formats converts to float32 exactly (the value
// core/fp8.h decodes) and back to the same code (a NaN code to the canonical NaN of its sign).
TEST(CopyFp8, EveryCodeRoundTripsThroughFloat32) {
  for (DType dt : kF8) {
    const Fp8Format f = fp8_format_of(dt);
    Tensor codes = all_codes(dt);
    Tensor wide = codes.to(DType::Float32);
    EXPECT_EQ(wide.dtype(), DType::Float32);
    const std::vector<float> v = to_vector<float>(wide);
    const std::vector<uint8_t> back = codes_of(wide.to(dt));
    for (int c = 0; c < 256; ++c) {
      const float want = fp8_to_float(static_cast<uint8_t>(c), f);
      EXPECT_TRUE(same_float(v[c], want)) << dtype_name(dt) << " code " << c;
      const uint8_t want_back = std::isnan(want) ? static_cast<uint8_t>((c & 0x80) | 0x7F) : c;
      EXPECT_EQ(back[c], want_back) << dtype_name(dt) << " code " << c;
    }
  }
}

// Property: float32, bfloat16 and float16 tensors (contiguous or transposed) convert to each
// float8 dtype exactly as fp8_from_float converts their values without saturation (Note [FP8
// storage types]): one rounding, since bf16/f16 widen to float exactly.
TEST(CopyFp8, FromFloatDtypesRoundsOnceWithoutSaturation) {
  const std::vector<float> probe = probe_values();
  const int64_t n = static_cast<int64_t>(probe.size());
  ASSERT_EQ(n % 2, 0);
  for (DType src : {DType::Float32, DType::BFloat16, DType::Float16}) {
    const Tensor x = from_vector<float>(probe, {2, n / 2}).to(src);
    const std::vector<float> exact = to_vector<float>(x);  // the values x holds, exactly
    for (DType dt : kF8) {
      const Fp8Format f = fp8_format_of(dt);
      const std::vector<uint8_t> got = codes_of(x.to(dt));
      const std::vector<uint8_t> got_t = codes_of(x.t().to(dt).t());
      Tensor into = Tensor::empty({n / 2, 2}, dt);
      into.t().copy_(x);  // a strided destination
      const std::vector<uint8_t> got_into = codes_of(into.t());
      size_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t want = fp8_from_float(exact[i], f, /*saturate=*/false);
        if (got[i] != want || got_t[i] != want || got_into[i] != want) {
          if (++bad <= 3)
            ADD_FAILURE() << dtype_name(src) << " -> " << dtype_name(dt) << ": " << exact[i]
                          << " gave " << int(got[i]) << "/" << int(got_t[i]) << "/"
                          << int(got_into[i]) << ", want " << int(want);
        }
      }
      EXPECT_EQ(bad, 0u) << dtype_name(src) << " -> " << dtype_name(dt);
    }
  }
  // Beyond the range without saturation: NaN (e4m3fn has no infinity) and inf (e5m2).
  const Tensor big = from_vector<float>({500.f, -1e9f, INFINITY}, {3});
  EXPECT_EQ(codes_of(big.to(DType::Float8E4M3FN)), (std::vector<uint8_t>{0x7F, 0xFF, 0x7F}));
  EXPECT_EQ(codes_of(big.to(DType::Float8E5M2)), (std::vector<uint8_t>{0x60, 0xFC, 0x7C}));  // 512
}

// Property: integer and bool tensors convert through their (exact, within FP8's range) float
// value; out-of-range integers overflow like floats.
TEST(CopyFp8, FromIntegersAndBool) {
  const Tensor i64 =
      from_vector<int64_t>({0, 1, -3, 17, 448, 449, 100000, -(int64_t{1} << 40)}, {8});
  const Tensor b = from_vector<bool>({true, false}, {2});
  for (DType dt : kF8) {
    const Fp8Format f = fp8_format_of(dt);
    for (DType it : {DType::Int32, DType::Int64}) {
      const std::vector<uint8_t> got = codes_of(i64.to(it).to(dt));
      const std::vector<int64_t> vals = to_vector<int64_t>(i64.to(it));
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(got[i], fp8_from_float(static_cast<float>(vals[i]), f, false))
            << dtype_name(it) << " " << vals[i] << " -> " << dtype_name(dt);
    }
    EXPECT_EQ(codes_of(b.to(dt)), (std::vector<uint8_t>{fp8_from_float(1.f, f), 0x00}));
  }
}

// Property: float8 tensors convert to every other dtype through their exact float value:
// bf16 and f16 hold every FP8 value exactly; int32 truncates finite values; bool is value != 0
// (NaN is true); the other float8 format rounds that value once, without saturation.
TEST(CopyFp8, ToOtherDtypesThroughTheExactValue) {
  for (DType dt : kF8) {
    const Fp8Format f = fp8_format_of(dt);
    const Tensor codes = all_codes(dt);
    const Tensor codes_t = codes.t();  // strided source
    const std::vector<float> bf = to_vector<float>(codes.to(DType::BFloat16));
    const std::vector<float> hf = to_vector<float>(codes_t.to(DType::Float16).t());
    const std::vector<int32_t> i32 = to_vector<int32_t>(codes.to(DType::Int32));
    const Tensor bl = codes.to(DType::Bool);
    const std::vector<int64_t> b = to_vector<int64_t>(bl);
    const DType other = dt == DType::Float8E4M3FN ? DType::Float8E5M2 : DType::Float8E4M3FN;
    const std::vector<uint8_t> cross = codes_of(codes.to(other));
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), f);
      EXPECT_TRUE(same_float(bf[c], v)) << dtype_name(dt) << " -> bfloat16, code " << c;
      EXPECT_TRUE(same_float(hf[c], v)) << dtype_name(dt) << " -> float16, code " << c;
      if (std::isfinite(v)) {
        EXPECT_EQ(i32[c], static_cast<int32_t>(v)) << "code " << c;
      }
      EXPECT_EQ(b[c], v != 0.f ? 1 : 0) << "code " << c;
      EXPECT_EQ(cross[c], fp8_from_float(v, fp8_format_of(other), false))
          << dtype_name(dt) << " -> " << dtype_name(other) << ", code " << c;
    }
  }
}

// Property: to_fp8 with saturate equals fp8_from_float(x, f, saturate=true) for every probe
// value, from float32 (contiguous: the array path) and from strided bf16; without saturate it
// equals Tensor::to. Bad targets and inputs are errors naming to_fp8.
TEST(CopyFp8, ToFp8Saturates) {
  const std::vector<float> probe = probe_values();
  const int64_t n = static_cast<int64_t>(probe.size());
  const Tensor x = from_vector<float>(probe, {2, n / 2});
  const Tensor xb = x.to(DType::BFloat16);
  const std::vector<float> xb_vals = to_vector<float>(xb);
  for (DType dt : kF8) {
    const Fp8Format f = fp8_format_of(dt);
    const std::vector<uint8_t> sat = codes_of(to_fp8(x, dt));
    const std::vector<uint8_t> sat_b = codes_of(to_fp8(xb.t(), dt, true).t());
    const std::vector<uint8_t> nosat = codes_of(to_fp8(x, dt, /*saturate=*/false));
    const std::vector<uint8_t> plain = codes_of(x.to(dt));
    EXPECT_EQ(nosat, plain);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(sat[i], fp8_from_float(probe[i], f, true)) << dtype_name(dt) << " " << probe[i];
      ASSERT_EQ(sat_b[i], fp8_from_float(xb_vals[i], f, true)) << dtype_name(dt) << " bf16";
    }
    const uint8_t max = dt == DType::Float8E4M3FN ? 0x7E : 0x7B;
    const Tensor big = from_vector<float>({1e6f, -INFINITY, NAN}, {3});
    EXPECT_EQ(codes_of(to_fp8(big, dt)),
              (std::vector<uint8_t>{max, static_cast<uint8_t>(0x80 | max), 0x7F}));
    EXPECT_EQ(to_fp8(x.to(dt), dt).dtype(), dt);
  }
  EXPECT_NE(test::error_of([&] {
              to_fp8(x, DType::BFloat16);
            }).find("to_fp8: target dtype must be float8_e4m3fn or float8_e5m2, got bfloat16"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              to_fp8(x.to(DType::Float8E5M2), DType::Float8E4M3FN);
            }).find("to_fp8: the input float8_e5m2[2, "),
            std::string::npos);
}

// Property: copies between tensors of the same float8 dtype move bytes, whatever the layout:
// E5M2's several NaN codes survive contiguous(), clone() and copy_ unchanged.
TEST(CopyFp8, SameDtypeCopiesKeepEveryByte) {
  for (DType dt : kF8) {
    const Tensor codes = all_codes(dt);
    std::vector<uint8_t> want_t(256);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) want_t[c * 16 + r] = static_cast<uint8_t>(r * 16 + c);
    EXPECT_EQ(codes_of(codes.t().contiguous()), want_t) << dtype_name(dt);
    EXPECT_EQ(codes_of(codes.clone()), codes_of(codes));
    Tensor dst = Tensor::empty({16, 16}, dt);
    dst.t().copy_(codes);  // strided destination, same dtype
    EXPECT_EQ(codes_of(dst.t()), codes_of(codes));
    Tensor row = Tensor::empty({3, 16}, dt);
    row.copy_(codes.select(0, 7));  // broadcast
    for (int r = 0; r < 3; ++r) EXPECT_EQ(codes_of(row.select(0, r)), codes_of(codes.select(0, 7)));
  }
}

// Property: views, reshapes, slicing and joins work on float8 tensors and move exactly the
// bytes they move for any dtype; fill_ / ones / full convert their value like to(); item() and
// printing show the decoded values.
TEST(CopyFp8, ViewsJoinsFillAndPrint) {
  for (DType dt : kF8) {
    const Fp8Format f = fp8_format_of(dt);
    const Tensor codes = all_codes(dt);
    const std::vector<uint8_t> all = codes_of(codes);
    EXPECT_EQ(codes_of(codes.view({256})), all);
    EXPECT_EQ(codes_of(codes.reshape({4, 64})), all);
    EXPECT_EQ(codes_of(codes.t().reshape({256})), codes_of(codes.t().contiguous()));
    const std::vector<uint8_t> sl = codes_of(codes.slice(1, 2, 11, 3));
    ASSERT_EQ(sl.size(), 48u);
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 3; ++k) EXPECT_EQ(sl[r * 3 + k], r * 16 + 2 + 3 * k);
    EXPECT_EQ(codes_of(codes.narrow(0, 3, 2)),
              std::vector<uint8_t>(all.begin() + 48, all.begin() + 80));
    const Tensor c = cat({codes.narrow(0, 0, 2), codes.narrow(0, 14, 2)}, 0);
    EXPECT_EQ(c.dtype(), dt);
    std::vector<uint8_t> want_cat;  // rows 0-1, then rows 14-15
    for (int i = 0; i < 256; ++i) {
      if (i < 32 || i >= 224) want_cat.push_back(all[i]);
    }
    EXPECT_EQ(codes_of(c), want_cat);
    const Tensor s = stack({codes.select(0, 1), codes.select(0, 0)}, 1);
    EXPECT_EQ(s.sizes(), (Shape{16, 2}));
    EXPECT_EQ(codes_of(s)[1], 0);
    EXPECT_EQ(codes_of(s)[0], 16);

    EXPECT_EQ(codes_of(ones({3}, {dt})), std::vector<uint8_t>(3, fp8_from_float(1.f, f)));
    EXPECT_EQ(codes_of(zeros({2}, {dt})), std::vector<uint8_t>(2, 0));
    EXPECT_EQ(codes_of(full({2}, -0.3, {dt})),
              std::vector<uint8_t>(2, fp8_from_float(-0.3f, f, false)));
    EXPECT_EQ(codes_of(full({1}, 1e6, {dt})),
              std::vector<uint8_t>(1, fp8_from_float(1e6f, f, false)));
    Tensor strided = zeros({4, 4}, {dt});
    strided.t().select(0, 1).fill_(2.0);  // a column
    EXPECT_EQ(to_vector<float>(strided.select(1, 1)), std::vector<float>(4, 2.f));
    EXPECT_EQ(to_vector<float>(strided.select(1, 0)), std::vector<float>(4, 0.f));

    EXPECT_EQ(from_codes({0x40}, dt, {}).item<float>(), fp8_to_float(0x40, f));
    const std::string str = from_codes({0x38, 0xC0}, dt, {2}).str();
    EXPECT_EQ(str, std::string("tensor([") +
                       (dt == DType::Float8E4M3FN ? "1.0000, -2.0000" : "0.5000, -2.0000") +
                       "], dtype=" + dtype_name(dt) + ")");
  }
}

// Property: arithmetic refuses float8 tensors with the op's "unsupported dtype" error naming
// the dtype; mixing with another dtype is promote_types' error; autograd never reaches them.
TEST(CopyFp8, ArithmeticRefusesFloat8) {
  const Tensor a = ones({2, 2}, {DType::Float8E4M3FN});
  const Tensor f = ones({2, 2});
  auto expect_error = [](const std::string& msg, const std::vector<std::string>& parts) {
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " / " << p;
  };
  expect_error(test::error_of([&] { add(a, a); }), {"add", "unsupported dtype float8_e4m3fn"});
  expect_error(test::error_of([&] { mul(a, 2.0); }), {"mul", "float8_e4m3fn"});
  expect_error(test::error_of([&] { exp(a); }), {"exp", "float8_e4m3fn"});
  expect_error(test::error_of([&] { sum(a); }), {"sum", "float8_e4m3fn"});
  expect_error(test::error_of([&] { matmul(a, a); }), {"float8_e4m3fn"});
  expect_error(test::error_of([&] { add(a, f); }),
               {"promotion between float8_e4m3fn and float32 is not supported"});
  expect_error(test::error_of([&] {
                 Tensor t = a.clone();
                 t.set_requires_grad(true);
               }),
               {"float8_e4m3fn"});
  Tensor w = ones({2}).set_requires_grad(true);
  const Tensor q = w.to(DType::Float8E5M2);
  EXPECT_FALSE(q.requires_grad());
  EXPECT_EQ(q.grad_fn(), nullptr);
}

}  // namespace
