// The CUDA reductions (sum, mean, max/min, max along a dim, argmax, amax, var, norm) against the
// CPU backend, which is their specification: same shapes, dtypes, NaN rules, tie-breaking (the
// first extremum) and errors.
//
// Tolerances: both backends accumulate floating sums in double and round once, but in different
// orders, so a result may differ by one rounding of the output type: fp32 1e-5 relative (plus a
// tiny absolute slack for sums that cancel to ~0), bf16 1e-2 (one bf16 ulp is 2^-8 relative),
// f16 2e-3 (one ulp 2^-11). Integer sums, max/min/amax values and every index are exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/error.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

const DType kFloats[] = {DType::Float32, DType::BFloat16, DType::Float16};

// Values of dtype dt: normal floats, integers in [-1000, 1000), or random bools.
// got (a CUDA tensor) has want's dtype and shape and its values: floats within atol + rtol*|w|
// (NaN matches NaN, infinities match exactly), integers and bools exactly.
void expect_match(const Tensor& want, const Tensor& got_gpu, double rtol, double atol,
                  const std::string& what) {
  ASSERT_TRUE(got_gpu.is_cuda()) << what;
  const Tensor got = got_gpu.to(kCPU);
  ASSERT_EQ(want.dtype(), got.dtype()) << what;
  ASSERT_EQ(want.sizes(), got.sizes()) << what;
  if (is_floating(want.dtype())) {
    const auto w = to_vector<float>(want), g = to_vector<float>(got);
    for (size_t i = 0; i < w.size(); ++i) {
      if (std::isnan(w[i]) || std::isnan(g[i]) || std::isinf(w[i]) || std::isinf(g[i])) {
        ASSERT_TRUE((std::isnan(w[i]) && std::isnan(g[i])) || w[i] == g[i])
            << what << " at " << i << ": want " << w[i] << " got " << g[i];
        continue;
      }
      ASSERT_NEAR(g[i], w[i], atol + rtol * std::fabs(w[i])) << what << " at " << i;
    }
  } else {
    const auto w = to_vector<int64_t>(want), g = to_vector<int64_t>(got);
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(w[i], g[i]) << what << " at " << i;
  }
}

void expect_exact(const Tensor& want, const Tensor& got_gpu, const std::string& what) {
  expect_match(want, got_gpu, 0.0, 0.0, what);
}

std::string name(const char* op, const Tensor& x, const Shape& dims, bool keepdim) {
  return std::string(op) + " " + describe(x) + " dims " + shape_str(dims) +
         (keepdim ? " keepdim" : "");
}

// Shapes and dim lists covering first, middle, last, several, all (empty list) and negative
// dims, size-1 dims, odd sizes and rows longer than a block's chunk.
struct Case {
  Shape shape;
  std::vector<Shape> dims;
};
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{7, 13, 5}, {{}, {0}, {1}, {2}, {-1}, {-3}, {0, 2}, {1, 2}, {0, 1}, {2, 0, 1}}},
      {{3, 1, 4099}, {{}, {2}, {0, 2}, {1}, {0, 1}}},
      {{1, 1}, {{}, {0}, {1}}},
      {{33}, {{}, {0}}},
      {{2, 3, 4, 5}, {{1, 3}, {0, 3}, {1, 2}, {-2, -1}}},
      {{}, {{}}},
  };
  return c;
}

// f applied on the CPU and on the GPU copy of every case, in every dtype of `dts`.
template <typename F>
void for_cases(std::initializer_list<DType> dts, F f) {
  uint64_t seed = 1;
  for (DType dt : dts) {
    for (const Case& c : cases()) {
      const Tensor x = random_input(c.shape, dt, seed++);
      const Tensor xg = x.to(gpu());
      for (const Shape& dims : c.dims) {
        for (bool keepdim : {false, true}) f(x, xg, dims, keepdim);
      }
    }
  }
}

}  // namespace

TEST(ReductionCuda, SumEveryDtypeAndDims) {
  TD_REQUIRE_CUDA();
  for_cases(
      {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64, DType::Bool},
      [](const Tensor& x, const Tensor& xg, const Shape& dims, bool keepdim) {
        expect_match(sum(x, dims, keepdim), sum(xg, dims, keepdim), tol(x.dtype()), 1e-6,
                     name("sum", x, dims, keepdim));
      });
}

TEST(ReductionCuda, MeanFloatingDims) {
  TD_REQUIRE_CUDA();
  for_cases({DType::Float32, DType::BFloat16, DType::Float16},
            [](const Tensor& x, const Tensor& xg, const Shape& dims, bool keepdim) {
              expect_match(mean(x, dims, keepdim), mean(xg, dims, keepdim), tol(x.dtype()), 1e-6,
                           name("mean", x, dims, keepdim));
            });
}

TEST(ReductionCuda, IntegerSumsAccumulateInInt64) {
  TD_REQUIRE_CUDA();
  // 5000 values near 1e9 overflow int32 many times over; the int64 result must be exact.
  Generator gen(7);
  Tensor x = randint(900000000, 1000000000, {5000, 3}, {DType::Int32, kCPU, false}, &gen);
  Tensor xg = x.to(gpu());
  expect_exact(sum(x), sum(xg), "int32 full sum");
  expect_exact(sum(x, {0}), sum(xg, {0}), "int32 column sum");
  expect_exact(sum(x.t(), {1}), sum(xg.t(), {1}), "int32 row sum, transposed");
  EXPECT_EQ(sum(xg).dtype(), DType::Int64);
  Tensor b = gt(randn({1000003}, {}, &gen), 0.0);
  expect_exact(sum(b), sum(b.to(gpu())), "bool count");
}

TEST(ReductionCuda, LargeAndSplitShapes) {
  TD_REQUIRE_CUDA();
  struct Big {
    Shape shape;
    Shape dims;
  };
  // Full sums (two-pass, 2^24 + 3 elements), few long rows (rows split across blocks), many
  // block-sized rows, long columns with small inner (columns split), and a middle dim.
  const std::vector<Big> bigs = {{{(1 << 24) + 3}, {}}, {{2, 1000003}, {1}},
                                 {{5000, 4100}, {1}},   {{300001, 3}, {0}},
                                 {{4, 50001, 33}, {1}}, {{4097, 1, 65}, {0, 1}}};
  uint64_t seed = 100;
  for (const Big& b : bigs) {
    const Tensor x = random_input(b.shape, DType::Float32, seed++);
    const Tensor xg = x.to(gpu());
    expect_match(sum(x, b.dims), sum(xg, b.dims), 1e-5, 1e-5, name("sum", x, b.dims, false));
    expect_match(mean(x, b.dims), mean(xg, b.dims), 1e-5, 1e-7, name("mean", x, b.dims, false));
    expect_match(var(x, b.dims), var(xg, b.dims), 1e-5, 1e-7, name("var", x, b.dims, false));
    expect_exact(amax(x, b.dims), amax(xg, b.dims), name("amax", x, b.dims, false));
    const Tensor xb = x.to(DType::BFloat16), xbg = xb.to(gpu());
    expect_match(sum(xb, b.dims), sum(xbg, b.dims), 1e-2, 1e-2, name("sum", xb, b.dims, false));
  }
  const Tensor x = random_input({(1 << 24) + 3}, DType::Float32, 9);
  expect_match(norm(x), norm(x.to(gpu())), 1e-5, 0.0, "norm 2^24+3");
  expect_exact(max(x), max(x.to(gpu())), "max 2^24+3");
  expect_exact(argmax(x), argmax(x.to(gpu())), "argmax 2^24+3");
}

TEST(ReductionCuda, NonContiguousInputs) {
  TD_REQUIRE_CUDA();
  for (DType dt : kAll) {
    const Tensor base = random_input({6, 10, 9}, dt, 21);
    const Tensor bg = base.to(gpu());
    // The same view on both devices: transposed, strided slices, permuted.
    const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> views = {
        {"transpose", [](const Tensor& t) { return t.transpose(0, 2); }},
        {"slice step 2", [](const Tensor& t) { return t.slice(1, 1, 10, 2); }},
        {"permute",
         [](const Tensor& t) {
           return t.permute({1, 2, 0});
         }},
        {"select", [](const Tensor& t) { return t.select(2, 4); }},
    };
    for (const auto& [vname, v] : views) {
      const Tensor x = v(base), xg = v(bg);
      for (const Shape& dims : std::vector<Shape>{{}, {0}, {-1}, {0, 1}}) {
        const std::string what = vname + " " + name("", x, dims, false);
        expect_match(sum(x, dims), sum(xg, dims), tol(dt), 1e-6, "sum " + what);
        expect_exact(amax(x, dims), amax(xg, dims), "amax " + what);
        if (is_floating(dt)) {
          expect_match(var(x, dims, 1), var(xg, dims, 1), tol(dt), 1e-6, "var " + what);
          expect_match(norm(x), norm(xg), tol(dt), 0.0, "norm " + what);
        }
      }
      auto [v0, i0] = max(x, -1);
      auto [v1, i1] = max(xg, -1);
      expect_exact(v0, v1, vname + " max values");
      expect_exact(i0, i1, vname + " max indices");
    }
  }
}

TEST(ReductionCuda, MaxAlongDimFirstOfTiesAndNaN) {
  TD_REQUIRE_CUDA();
  for (DType dt : kAll) {
    // Few distinct values: many ties, so the first-index rule is exercised everywhere.
    Generator gen(5);
    Tensor x = randint(0, 3, {9, 17, 4101}, {DType::Int64, kCPU, false}, &gen).to(dt);
    if (is_floating(dt)) {
      Tensor flat = x.view({-1});
      for (int64_t k : {5, 77, 4101 * 3 + 2, 4101 * 3 + 9, 200000}) flat.select(0, k).fill_(NAN);
    }
    const Tensor xg = x.to(gpu());
    for (int64_t dim : {0, 1, 2, -1, -2}) {
      for (bool keepdim : {false, true}) {
        const std::string what = name("max", x, {dim}, keepdim);
        auto [v0, i0] = max(x, dim, keepdim);
        auto [v1, i1] = max(xg, dim, keepdim);
        expect_exact(v0, v1, what + " values");
        expect_exact(i0, i1, what + " indices");
        expect_exact(argmax(x, dim, keepdim), argmax(xg, dim, keepdim), what + " argmax");
      }
    }
    expect_exact(max(x), max(xg), std::string("max all ") + dtype_name(dt));
    expect_exact(min(x), min(xg), std::string("min all ") + dtype_name(dt));
    expect_exact(argmax(x), argmax(xg), std::string("argmax all ") + dtype_name(dt));
    expect_exact(argmax(x, std::nullopt, true), argmax(xg, std::nullopt, true),
                 std::string("argmax all keepdim ") + dtype_name(dt));
  }
  // One long row (split into chunks): the first maximum wins across chunk boundaries.
  Tensor row = zeros({3000017});
  for (int64_t k : {2999999, 1234567, 4096 * 7, 4096 * 7 + 1}) row.select(0, k).fill_(5.0);
  auto [v, i] = max(row.to(gpu()), 0);
  EXPECT_EQ(i.item<int64_t>(), 4096 * 7);
  EXPECT_EQ(v.item<float>(), 5.f);
  row.select(0, 2000000).fill_(NAN);
  row.select(0, 2999998).fill_(NAN);
  auto [vn, in] = max(row.to(gpu()), 0);
  EXPECT_EQ(in.item<int64_t>(), 2000000);
  EXPECT_TRUE(std::isnan(vn.item<float>()));
  EXPECT_TRUE(std::isnan(min(row.to(gpu())).item<float>()));
}

TEST(ReductionCuda, AmaxMinDims) {
  TD_REQUIRE_CUDA();
  for_cases(
      {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64, DType::Bool},
      [](const Tensor& x, const Tensor& xg, const Shape& dims, bool keepdim) {
        if (x.numel() == 0) return;
        expect_exact(amax(x, dims, keepdim), amax(xg, dims, keepdim),
                     name("amax", x, dims, keepdim));
        if (dims.empty() && !keepdim) {
          expect_exact(max(x), max(xg), name("max", x, dims, keepdim));
          expect_exact(min(x), min(xg), name("min", x, dims, keepdim));
        }
      });
}

TEST(ReductionCuda, VarCorrections) {
  TD_REQUIRE_CUDA();
  for (int64_t correction : {0, 1, 2}) {
    for_cases({DType::Float32, DType::BFloat16, DType::Float16},
              [&](const Tensor& x, const Tensor& xg, const Shape& dims, bool keepdim) {
                expect_match(
                    var(x, dims, correction, keepdim), var(xg, dims, correction, keepdim),
                    tol(x.dtype()), 1e-6,
                    name("var", x, dims, keepdim) + " correction " + std::to_string(correction));
              });
  }
  // A large offset: the two-pass algorithm must not cancel catastrophically.
  Tensor x = add(mul(random_input({64, 1000}, DType::Float32, 3), 1e-3), 1e4);
  expect_match(var(x, {1}), var(x.to(gpu()), {1}), 1e-5, 0.0, "var with offset 1e4");
}

TEST(ReductionCuda, EmptyReductions) {
  TD_REQUIRE_CUDA();
  for (DType dt : kAll) {
    const Tensor x = random_input({3, 0, 4}, dt, 1), xg = x.to(gpu());
    expect_exact(sum(x, {1}), sum(xg, {1}), "sum over an empty dim");  // zeros
    expect_exact(sum(x), sum(xg), "sum of an empty tensor");
    expect_exact(sum(x, {0}), sum(xg, {0}), "sum with an empty output");
    EXPECT_EQ(sum(xg, {0}).sizes(), (Shape{0, 4}));
    expect_exact(amax(x, {0}), amax(xg, {0}), "amax with an empty output");
    EXPECT_THROW(max(xg), Error);
    EXPECT_THROW(amax(xg, {1}), Error);
    EXPECT_THROW(max(xg, 1), Error);
    EXPECT_THROW(argmax(xg), Error);
    if (is_floating(dt)) {
      expect_match(mean(x, {1}), mean(xg, {1}), 0.0, 0.0, "mean over an empty dim");  // NaN
      expect_match(var(x, {1}), var(xg, {1}), 0.0, 0.0, "var over an empty dim");     // NaN
      expect_exact(norm(x), norm(xg), "norm of an empty tensor");                     // 0
    }
  }
  // count == correction: divisor 0 gives inf (or NaN for a constant row), as on the CPU.
  const Tensor one = random_input({5, 1}, DType::Float32, 2);
  expect_match(var(one, {1}), var(one.to(gpu()), {1}), 0.0, 0.0, "var of one element");
}

TEST(ReductionCuda, Norm) {
  TD_REQUIRE_CUDA();
  for (DType dt : kFloats) {
    for (int64_t n : {1, 7, 4096, 4097, 1000003}) {
      const Tensor x = random_input({n}, dt, static_cast<uint64_t>(n));
      expect_match(norm(x), norm(x.to(gpu())), tol(dt), 0.0, "norm " + describe(x));
    }
  }
  expect_exact(norm(zeros({10})), norm(zeros({10}).to(gpu())), "norm of zeros");
}

TEST(ReductionCuda, Gradients) {
  TD_REQUIRE_CUDA();
  const Shape s = {5, 6, 7};
  // y -> sum(y * w) with a random w, so each output's gradient differs.
  auto run = [&](const std::function<Tensor(const Tensor&)>& f, const Tensor& x0, Device dev,
                 uint64_t seed) {
    Tensor x = dev.is_cpu() ? x0.clone() : x0.to(dev);  // a fresh leaf every run
    x.set_requires_grad(true);
    Tensor y = f(x);
    Generator gen(seed);
    Tensor w = randn(y.sizes(), {}, &gen).to(dev);
    sum(mul(y, w)).backward();
    return x.grad();
  };
  // Ties for amax/max (gradient split evenly / to the first index).
  Generator gen(11);
  const Tensor ties = randint(0, 4, s, {DType::Int64, kCPU, false}, &gen).to(DType::Float32);
  const Tensor smooth = random_input(s, DType::Float32, 12);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> fs = {
      {"sum",
       [](const Tensor& x) {
         return sum(x, {0, 2});
       }},
      {"sum all", [](const Tensor& x) { return sum(x); }},
      {"mean keepdim", [](const Tensor& x) { return mean(x, {-1}, true); }},
      {"amax", [](const Tensor& x) { return amax(x, {1}); }},
      {"max dim", [](const Tensor& x) { return max(x, 1).first; }},
      {"max dim keepdim", [](const Tensor& x) { return max(x, -1, true).first; }},
      {"max all", [](const Tensor& x) { return max(x); }},
      {"min all", [](const Tensor& x) { return min(x); }},
      {"var",
       [](const Tensor& x) {
         return var(x, {1, 2});
       }},
      {"var correction 0", [](const Tensor& x) { return var(x, {0}, 0, true); }},
      {"norm", [](const Tensor& x) { return norm(x); }},
      {"transposed sum", [](const Tensor& x) { return sum(x.transpose(0, 2), {1}); }},
  };
  for (const auto& [fname, f] : fs) {
    for (const Tensor* x : {&ties, &smooth}) {
      const Tensor g0 = run(f, *x, kCPU, 3), g1 = run(f, *x, gpu(), 3);
      expect_match(g0, g1, 1e-5, 1e-6, fname + " gradient");
    }
  }
}

TEST(ReductionCuda, BitwiseDeterministic) {
  TD_REQUIRE_CUDA();
  const Tensor a = random_input({(1 << 22) + 5}, DType::Float32, 31).to(gpu());
  const Tensor b = random_input({100003, 7}, DType::Float32, 32).to(gpu());
  const Tensor c = random_input({3, 700001}, DType::BFloat16, 33).to(gpu());
  for (int rep = 0; rep < 2; ++rep) {
    expect_bitwise(sum(a), sum(a), "full sum");
    expect_bitwise(mean(b, {0}), mean(b, {0}), "column mean");
    expect_bitwise(var(b, {0}), var(b, {0}), "column var");
    expect_bitwise(sum(c, {1}), sum(c, {1}), "bf16 long rows");
    expect_bitwise(var(c, {1}), var(c, {1}), "bf16 long-row var");
    expect_bitwise(norm(a), norm(a), "norm");
    expect_bitwise(max(b, 0).second, max(b, 0).second, "max indices");
  }
}

TEST(ReductionCuda, Errors) {
  TD_REQUIRE_CUDA();
  const Tensor xi = random_input({4, 5}, DType::Int32, 1).to(gpu());
  const Tensor xf = random_input({4, 5}, DType::Float32, 1).to(gpu());
  EXPECT_THROW(mean(xi), Error);
  EXPECT_THROW(var(xi), Error);
  EXPECT_THROW(norm(xi), Error);
  EXPECT_THROW(var(xf, {0}, -1), Error);
  EXPECT_THROW(sum(xf, {2}), Error);
  EXPECT_THROW(sum(xf, {0, 0}), Error);
  EXPECT_THROW(max(xf, -3), Error);
  EXPECT_THROW(amax(xf, {5}), Error);
}
