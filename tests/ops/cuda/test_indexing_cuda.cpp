// index_select and index_add on CUDA against the CPU backend. index_select moves bytes and
// index_add adds each output's contributions in increasing source position in the CPU's
// accumulation type (fp32 for bf16/f16), so both must match the CPU bitwise in every dtype.
#include <gtest/gtest.h>

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

const DType kNumeric[] = {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32,
                          DType::Int64};

// n indices in [0, size) with many repeats, as dtype dt (int32 or int64).
Tensor indices(int64_t n, int64_t size, DType dt, uint64_t seed) {
  Generator gen(seed);
  return randint(0, size, {n}, {dt, kCPU, false}, &gen);
}

std::string what(const char* op, const Tensor& x, int64_t dim, const Tensor& idx) {
  return std::string(op) + " " + describe(x) + " dim " + std::to_string(dim) + " index " +
         describe(idx);
}

}  // namespace

TEST(IndexingCuda, IndexSelectEveryDtypeAndDim) {
  TD_REQUIRE_CUDA();
  uint64_t seed = 1;
  for (DType dt : kAll) {
    const Tensor x = random_input({7, 5, 3}, dt, seed++);
    const Tensor xg = x.to(gpu());
    for (int64_t dim : {0, 1, 2, -1, -3}) {
      const int64_t size = x.size(dim < 0 ? dim + 3 : dim);
      for (DType it : {DType::Int32, DType::Int64}) {
        for (int64_t n : {0, 1, 4, 11}) {
          const Tensor idx = indices(n, size, it, seed++);
          expect_bitwise(index_select(x, dim, idx), index_select(xg, dim, idx.to(gpu())),
                         what("index_select", x, dim, idx));
        }
      }
    }
  }
}

TEST(IndexingCuda, IndexSelectLayoutsAndSizes) {
  TD_REQUIRE_CUDA();
  // Rows of 64 floats (16-byte words), 3 bf16 (2-byte words), single elements (inner 1), a
  // contiguous view at an odd offset (4-byte words only), strided and transposed inputs, a
  // strided index and a 0-dim index. The view is taken on each device's own copy of the base.
  using View = std::function<Tensor(const Tensor&)>;
  const View same = [](const Tensor& t) { return t; };
  struct Case {
    Tensor base;
    View view;
    int64_t dim;
    Tensor idx;
  };
  const Tensor big = random_input({50000, 64}, DType::Float32, 2);
  const std::vector<Case> cs = {
      {big, same, 0, indices(8191, 50000, DType::Int64, 3)},
      {random_input({1000, 3}, DType::BFloat16, 4), same, 0, indices(5000, 1000, DType::Int32, 5)},
      {random_input({1, 100003}, DType::Float32, 6), same, 1,
       indices(70001, 100003, DType::Int64, 7)},
      {big,
       [](const Tensor& t) {
         return t.view({-1}).slice(0, 1, 1 + 4999 * 64).view({4999, 64});
       },
       0, indices(300, 4999, DType::Int64, 8)},
      {big, [](const Tensor& t) { return t.slice(1, 1, 64); }, 0,
       indices(300, 50000, DType::Int64, 8)},
      {big, [](const Tensor& t) { return t.slice(0, 0, 40).t(); }, 1,
       indices(100, 40, DType::Int64, 9)},
      {random_input({9, 8}, DType::Int64, 10), same, 1,
       indices(30, 8, DType::Int64, 11).slice(0, 0, 30, 3)},
      {random_input({9, 8}, DType::Float16, 12), same, 0, scalar_tensor(4, DType::Int64)},
  };
  for (const Case& c : cs) {
    const Tensor x = c.view(c.base), xg = c.view(c.base.to(gpu()));
    expect_bitwise(index_select(x, c.dim, c.idx), index_select(xg, c.dim, c.idx.to(gpu())),
                   what("index_select", x, c.dim, c.idx));
  }
  // The GPU input itself non-contiguous (a view of a GPU tensor).
  const Tensor bg = big.to(gpu());
  const Tensor idx = indices(100, 64, DType::Int64, 13);
  expect_bitwise(index_select(big.t(), 0, idx), index_select(bg.t(), 0, idx.to(gpu())),
                 "index_select of a transposed GPU tensor");
}

TEST(IndexingCuda, IndexAddMatchesCpuBitwise) {
  TD_REQUIRE_CUDA();
  uint64_t seed = 100;
  for (DType dt : kNumeric) {
    const Tensor x = random_input({6, 5, 4}, dt, seed++);
    for (int64_t dim : {0, 1, 2, -2}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      for (DType it : {DType::Int32, DType::Int64}) {
        for (int64_t n : {0, 1, 3, 17}) {
          const Tensor idx = indices(n, x.size(d), it, seed++);
          Shape ss = x.sizes();
          ss[d] = n;
          const Tensor src = random_input(ss, dt, seed++);
          expect_bitwise(index_add(x, dim, idx, src),
                         index_add(x.to(gpu()), dim, idx.to(gpu()), src.to(gpu())),
                         what("index_add", x, dim, idx));
        }
      }
    }
  }
}

TEST(IndexingCuda, IndexAddLargeRepeatedAndNonContiguous) {
  TD_REQUIRE_CUDA();
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    // 20000 rows into 1000: about 20 contributions per row, summed in source order.
    const Tensor x = random_input({1000, 128}, dt, 1);
    const Tensor idx = indices(20000, 1000, DType::Int64, 2);
    const Tensor src = random_input({20000, 128}, dt, 3);
    const Tensor want = index_add(x, 0, idx, src);
    const Tensor got = index_add(x.to(gpu()), 0, idx.to(gpu()), src.to(gpu()));
    expect_bitwise(want, got, std::string("index_add large ") + dtype_name(dt));
    // Deterministic: a second run gives the same bytes.
    expect_bitwise(got.to(kCPU), index_add(x.to(gpu()), 0, idx.to(gpu()), src.to(gpu())),
                   "index_add run twice");
    // Along dim 1 with inner 1 (one thread per output, many binary searches).
    const Tensor xt = random_input({3, 5000}, dt, 4);
    const Tensor it = indices(60000, 5000, DType::Int32, 5);
    const Tensor st = random_input({3, 60000}, dt, 6);
    expect_bitwise(index_add(xt, 1, it, st), index_add(xt.to(gpu()), 1, it.to(gpu()), st.to(gpu())),
                   "index_add dim 1");
  }
  // Non-contiguous x, src and index on the GPU.
  const Tensor x = random_input({8, 10}, DType::Float32, 7);
  const Tensor src = random_input({8, 12}, DType::Float32, 8);  // src.t(): [12, 8]
  const Tensor idx = indices(24, 10, DType::Int64, 9);
  const Tensor xg = x.to(gpu()), sg = src.to(gpu()), ig = idx.to(gpu());
  expect_bitwise(index_add(x.t(), 0, idx.slice(0, 0, 24, 2), src.t().contiguous()),
                 index_add(xg.t(), 0, ig.slice(0, 0, 24, 2), sg.t()),
                 "index_add of transposed tensors");
}

TEST(IndexingCuda, Gradients) {
  TD_REQUIRE_CUDA();
  const Tensor x0 = random_input({6, 7, 3}, DType::Float32, 1);
  const Tensor idx = indices(13, 7, DType::Int64, 2);  // repeats: gradients add up
  const Tensor src0 = random_input({6, 13, 3}, DType::Float32, 3);
  const Tensor w_sel = random_input({6, 13, 3}, DType::Float32, 4);
  const Tensor w_add = random_input({6, 7, 3}, DType::Float32, 5);
  auto grads = [&](Device dev) {
    Tensor x = dev.is_cpu() ? x0.clone() : x0.to(dev);
    Tensor src = dev.is_cpu() ? src0.clone() : src0.to(dev);
    x.set_requires_grad(true);
    src.set_requires_grad(true);
    const Tensor i = idx.to(dev);
    Tensor loss = add(sum(mul(index_select(x, 1, i), w_sel.to(dev))),
                      sum(mul(index_add(x, 1, i, src), w_add.to(dev))));
    loss.backward();
    return std::pair<Tensor, Tensor>{x.grad(), src.grad()};
  };
  auto [gx0, gs0] = grads(kCPU);
  auto [gx1, gs1] = grads(gpu());
  expect_bitwise(gx0, gx1, "input gradient");
  expect_bitwise(gs0, gs1, "source gradient");
}

TEST(IndexingCuda, Errors) {
  TD_REQUIRE_CUDA();
  const Tensor xg = random_input({4, 5}, DType::Float32, 1).to(gpu());
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Out of range, either side, in either index dtype: the op and the bad value are named.
  for (DType it : {DType::Int32, DType::Int64}) {
    const Tensor hi = from_vector<int64_t>({0, 3, 5, 1}, {4}).to(it).to(gpu());
    const Tensor lo = from_vector<int64_t>({2, -1}, {2}).to(it).to(gpu());
    std::string m = message([&] { index_select(xg, 1, hi); });
    EXPECT_NE(m.find("index_select"), std::string::npos) << m;
    EXPECT_NE(m.find("index 5 is out of range"), std::string::npos) << m;
    m = message([&] { index_select(xg, 0, lo); });
    EXPECT_NE(m.find("index -1 is out of range"), std::string::npos) << m;
    m = message([&] { index_add(xg, 1, hi, zeros({4, 4}).to(gpu())); });
    EXPECT_NE(m.find("index_add"), std::string::npos) << m;
    EXPECT_NE(m.find("index 5 is out of range"), std::string::npos) << m;
  }
  const Tensor ok = from_vector<int64_t>({0, 1}, {2});
  EXPECT_THROW(index_select(xg, 0, ok), Error);                               // index on the CPU
  EXPECT_THROW(index_select(xg, 0, ok.to(DType::Float32).to(gpu())), Error);  // float index
  EXPECT_THROW(index_select(xg, 0, zeros({2, 1}, {DType::Int64}).to(gpu())), Error);  // 2-D
  EXPECT_THROW(index_select(xg, 2, ok.to(gpu())), Error);                        // dim out of range
  EXPECT_THROW(index_add(xg, 0, ok.to(gpu()), zeros({3, 5}).to(gpu())), Error);  // src shape
  EXPECT_THROW(index_add(xg, 0, ok.to(gpu()), zeros({2, 5})), Error);            // src on CPU
  EXPECT_THROW(index_add(xg, 0, ok.to(gpu()), zeros({2, 5}, {DType::BFloat16}).to(gpu())), Error);
  const Tensor bg = gt(xg, 0.0);
  EXPECT_THROW(index_add(bg, 0, ok.to(gpu()), gt(zeros({2, 5}).to(gpu()), 0.0)), Error);  // bool
}
