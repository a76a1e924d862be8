// td::nn::ShardSpec (src/nn/shard_spec.cpp, Note [Shard specs]): where a rank's shard lies in the
// full tensor. take() and put() only copy values, so every comparison here is exact: the
// expected shard is built index by index from the definition (piece `index` of every segment,
// concatenated in segment order; rows past the full extent are zero padding).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/nn/shard_spec.h"
#include "tardelli/ops/factory.h"
#include "test_util.h"

namespace td::nn {
namespace {

using test::error_of;

// A [rows, cols] float32 tensor whose element (i, j) is 100 * i + j + 1 (never 0, so a zero in a
// shard can only be padding).
Tensor numbered(int64_t rows, int64_t cols) {
  std::vector<float> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(static_cast<float>(100 * i + j + 1));
  return from_vector<float>(v, {rows, cols});
}

// The full-tensor index (along the split dim) of each shard index, from the definition; -1 for
// padding.
std::vector<int64_t> source_indices(const std::vector<int64_t>& segments, int parts, int index,
                                    int64_t extent) {
  std::vector<int64_t> src;
  int64_t start = 0;
  for (int64_t seg : segments) {
    const int64_t k = seg / parts;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = start + index * k + j;
      src.push_back(i < extent ? i : -1);
    }
    start += seg;
  }
  return src;
}

// The expected shard of numbered(rows, cols) under `s`, element by element.
std::vector<float> expected_shard(const ShardSpec& s, int64_t rows, int64_t cols) {
  const int64_t extent = s.dim == 0 ? rows : cols;
  const std::vector<int64_t> src = source_indices(s.segments, s.parts, s.index, extent);
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<float> out;
  const int64_t out_rows = s.dim == 0 ? n : rows, out_cols = s.dim == 0 ? cols : n;
  for (int64_t i = 0; i < out_rows; ++i) {
    for (int64_t j = 0; j < out_cols; ++j) {
      const int64_t si = s.dim == 0 ? src[i] : i, sj = s.dim == 0 ? j : src[j];
      out.push_back(si < 0 || sj < 0 ? 0.0f : static_cast<float>(100 * si + sj + 1));
    }
  }
  return out;
}

// For every piece: take() equals the definition, and put()-ting every piece into a zero tensor
// rebuilds the full tensor exactly (padding dropped, nothing written twice or missed).
void check_round_trip(int64_t dim, const std::vector<int64_t>& segments, int parts, int64_t rows,
                      int64_t cols, bool transposed_input = false) {
  const Tensor full = transposed_input ? numbered(cols, rows).t() : numbered(rows, cols);
  ASSERT_EQ(transposed_input, !full.is_contiguous());
  // A transposed source holds (i, j) = 100 * j + i + 1 at its (i, j): compare against its values.
  const Tensor ref = full.contiguous();
  Tensor rebuilt = zeros({rows, cols});
  for (int index = 0; index < parts; ++index) {
    const ShardSpec s{dim, segments, parts, index};
    const Tensor shard = s.take(full);
    ASSERT_TRUE(shard.is_contiguous()) << s.str();
    EXPECT_FALSE(shard.requires_grad()) << s.str();
    EXPECT_EQ(shard.sizes(), s.shard_shape(full.sizes())) << s.str();
    if (!transposed_input) {
      EXPECT_EQ(to_vector<float>(shard), expected_shard(s, rows, cols)) << s.str();
    }
    s.put(shard, rebuilt);
  }
  EXPECT_EQ(to_vector<float>(rebuilt), to_vector<float>(ref))
      << "dim " << dim << " parts " << parts;
}

// A replicated spec holds the whole tensor: take is an independent copy, put overwrites all.
TEST(ShardSpec, ReplicatedTakesAndPutsTheWholeTensor) {
  const ShardSpec s = ShardSpec::replicated_spec();
  EXPECT_TRUE(s.replicated());
  EXPECT_EQ(s.str(), "replicated");
  const Tensor full = numbered(3, 4);
  EXPECT_EQ(s.shard_shape(full.sizes()), full.sizes());
  Tensor shard = s.take(full);
  EXPECT_FALSE(shard.shares_storage(full));
  EXPECT_EQ(to_vector<float>(shard), to_vector<float>(full));
  Tensor out = zeros({3, 4});
  s.put(shard, out);
  EXPECT_EQ(to_vector<float>(out), to_vector<float>(full));
  // parts == 1 is replicated whatever the dim.
  EXPECT_TRUE(ShardSpec::split(0, 3, 1, 0).replicated());
}

// One segment along dim 0 at 2 and 4 parts, and along dim 1 (columns).
TEST(ShardSpec, OneSegmentRoundTrip) {
  for (int parts : {2, 4}) {
    check_round_trip(0, {8}, parts, 8, 3);
    check_round_trip(1, {8}, parts, 3, 8);
  }
  const ShardSpec s = ShardSpec::split(0, 8, 4, 3);
  EXPECT_EQ(s, (ShardSpec{0, {8}, 4, 3}));
  EXPECT_EQ(s.shard_shape({8, 3}), (Shape{2, 3}));
  EXPECT_EQ(ShardSpec::split(1, 8, 2, 0).shard_shape({3, 8}), (Shape{3, 4}));
}

// A fused QKV weight [q 8, k 4, v 4] rows: each piece holds its own rows of q, then of k, then
// of v (e.g. at 2 parts piece 1 holds q rows 4-7, k rows 10-11, v rows 14-15).
TEST(ShardSpec, ThreeSegmentsLikeFusedQkv) {
  for (int parts : {2, 4}) {
    check_round_trip(0, {8, 4, 4}, parts, 16, 3);
    check_round_trip(1, {8, 4, 4}, parts, 3, 16);
  }
  const ShardSpec s{0, {8, 4, 4}, 2, 1};
  EXPECT_EQ(source_indices(s.segments, 2, 1, 16),
            (std::vector<int64_t>{4, 5, 6, 7, 10, 11, 14, 15}));
  EXPECT_EQ(s.shard_shape({16, 3}), (Shape{8, 3}));
  EXPECT_EQ(ShardSpec({0, {8, 4, 4}, 4, 0}).shard_shape({16, 5}), (Shape{4, 5}));
}

// A non-contiguous (transposed) full tensor is read through its strides.
TEST(ShardSpec, TakeFromNonContiguousFullTensor) {
  check_round_trip(0, {8, 4, 4}, 2, 16, 3, /*transposed_input=*/true);
  check_round_trip(1, {6}, 3, 4, 6, /*transposed_input=*/true);
}

// Segments summing to more than the full extent: the tail is zero padding (a vocabulary of 5
// padded to 8 over 4 ranks: piece 2 holds row 4 and a zero row, piece 3 only zeros), and put
// drops it, leaving the full tensor's other entries untouched.
TEST(ShardSpec, PaddingIsZeroInTakeAndDroppedInPut) {
  check_round_trip(0, {8}, 4, 5, 3);
  check_round_trip(0, {6}, 2, 5, 2);
  check_round_trip(1, {8}, 2, 2, 7);
  // Padding in the last of several segments.
  check_round_trip(0, {4, 4}, 2, 6, 2);

  const Tensor full = numbered(5, 3);
  const ShardSpec last{0, {8}, 4, 3};
  EXPECT_EQ(last.shard_shape(full.sizes()), (Shape{2, 3}));
  EXPECT_EQ(to_vector<float>(last.take(full)), std::vector<float>(6, 0.0f));
  const ShardSpec third{0, {8}, 4, 2};
  EXPECT_EQ(to_vector<float>(third.take(full)), (std::vector<float>{401, 402, 403, 0, 0, 0}));

  // put of a padded piece writes its real row only: the sentinel -1 elsewhere survives.
  Tensor out = full_like(full, -1.0);
  third.put(from_vector<float>({7, 8, 9, 70, 80, 90}, {2, 3}), out);
  std::vector<float> want(15, -1.0f);
  want[12] = 7;
  want[13] = 8;
  want[14] = 9;
  EXPECT_EQ(to_vector<float>(out), want);
  Tensor untouched = full_like(full, -1.0);
  last.put(from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}), untouched);
  EXPECT_EQ(to_vector<float>(untouched), std::vector<float>(15, -1.0f));
}

// Other dtypes are copied bit for bit (take/put never compute).
TEST(ShardSpec, Int64AndBFloat16RoundTrip) {
  const Tensor ids = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  const ShardSpec s = ShardSpec::split(0, 4, 2, 1);
  EXPECT_EQ(to_vector<int64_t>(s.take(ids)), (std::vector<int64_t>{5, 6, 7, 8}));
  const Tensor h = numbered(4, 2).to(DType::BFloat16);
  Tensor out = zeros({4, 2}, {DType::BFloat16});
  for (int i = 0; i < 2; ++i) {
    const ShardSpec p = ShardSpec::split(0, 4, 2, i);
    Tensor shard = p.take(h);
    EXPECT_EQ(shard.dtype(), DType::BFloat16);
    p.put(shard, out);
  }
  EXPECT_TRUE(test::same_bytes(out, h));
}

// to_json / from_json round trip every field; str() names them.
TEST(ShardSpec, JsonRoundTripAndStr) {
  const ShardSpec specs[] = {ShardSpec::replicated_spec(), ShardSpec::split(1, 256, 4, 3),
                             ShardSpec{0, {384, 128, 128}, 2, 1}};
  for (const ShardSpec& s : specs) {
    const json::Value v = s.to_json();
    ASSERT_TRUE(v.is_object());
    EXPECT_EQ(v.at("dim").as_int(), s.dim);
    EXPECT_EQ(v.at("parts").as_int(), s.parts);
    EXPECT_EQ(v.at("index").as_int(), s.index);
    EXPECT_EQ(static_cast<int64_t>(v.at("segments").as_array().size()),
              static_cast<int64_t>(s.segments.size()));
    EXPECT_EQ(ShardSpec::from_json(v), s) << s.str();
    // Through the text form as well (what a checkpoint stores).
    EXPECT_EQ(ShardSpec::from_json(json::parse(json::dump(v))), s) << s.str();
  }
  EXPECT_EQ(specs[2].str(), "dim 0 segments [384, 128, 128] / 2, piece 1");
  EXPECT_EQ(specs[1].str(), "dim 1 segments [256] / 4, piece 3");
  // A missing field is a td::Error naming it.
  json::Value bad = specs[1].to_json();
  bad.as_object().pop_back();  // drop "index"
  EXPECT_NE(error_of([&] { ShardSpec::from_json(bad); }).find("index"), std::string::npos);
}

// Bad specs raise td::Errors naming the spec and the problem, from shard_shape, take and put.
TEST(ShardSpec, BadSpecsRaise) {
  const Tensor full = numbered(8, 3);
  const auto msg = [&](const ShardSpec& s) { return error_of([&] { s.take(full); }); };
  // A segment not divisible by parts (fused QKV with 3 kv rows over 2 ranks).
  std::string m = msg(ShardSpec{0, {4, 3, 1}, 2, 0});
  EXPECT_NE(m.find("segment 3"), std::string::npos) << m;
  EXPECT_NE(m.find("multiple of 2"), std::string::npos) << m;
  // The piece index out of range.
  m = msg(ShardSpec{0, {8}, 2, 2});
  EXPECT_NE(m.find("piece 2 is not in [0, 2)"), std::string::npos) << m;
  m = msg(ShardSpec{0, {8}, 2, -1});
  EXPECT_NE(m.find("piece -1"), std::string::npos) << m;
  // The dim out of range.
  m = msg(ShardSpec{2, {8}, 2, 0});
  EXPECT_NE(m.find("splits dim 2"), std::string::npos) << m;
  EXPECT_NE(m.find("[8, 3]"), std::string::npos) << m;
  // Too few rows: the segments cover 6 of 8.
  m = msg(ShardSpec{0, {4, 2}, 2, 0});
  EXPECT_NE(m.find("covers 6 of the 8"), std::string::npos) << m;
  // No segments.
  m = msg(ShardSpec{0, {}, 2, 0});
  EXPECT_NE(m.find("no segments"), std::string::npos) << m;
  // shard_shape checks alike.
  m = error_of([&] { ShardSpec{0, {4, 2}, 2, 0}.shard_shape({8, 3}); });
  EXPECT_NE(m.find("ShardSpec.shard_shape"), std::string::npos) << m;
  // put: a shard of the wrong shape, and an undefined tensor.
  Tensor out = zeros({8, 3});
  m = error_of([&] { ShardSpec::split(0, 8, 2, 0).put(zeros({3, 3}), out); });
  EXPECT_NE(m.find("ShardSpec.put"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 3]"), std::string::npos) << m;
  m = error_of([&] { ShardSpec::split(0, 8, 2, 0).put(Tensor(), out); });
  EXPECT_NE(m.find("undefined"), std::string::npos) << m;
  m = error_of([&] { ShardSpec::split(0, 8, 2, 0).take(Tensor()); });
  EXPECT_NE(m.find("undefined"), std::string::npos) << m;
}

}  // namespace
}  // namespace td::nn
