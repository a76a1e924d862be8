// Layout-independent checkpoints (checkpoint/sharded_state.h): the box arithmetic (flat ranges,
// shard placements), and pieces saved by one layout read back by another (Note [Global pieces]).
// Everything here is an exact copy of values, so equality is bitwise.
#include "tardelli/checkpoint/sharded_state.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tardelli/ops/factory.h"
#include "test_util.h"

namespace {

namespace ck = td::checkpoint;
using td::Shape;
using td::Tensor;
using td::test::error_of;
using td::test::same_bytes;

// Row-major flat index of a multi-index.
int64_t flat_index(const Shape& shape, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

// The flat indices of a box's elements, in row-major order of the box.
std::vector<int64_t> box_flat(const Shape& shape, const ck::Box& b) {
  std::vector<int64_t> out;
  std::vector<int64_t> idx(b.offsets);
  if (b.numel() == 0) return out;
  while (true) {
    out.push_back(flat_index(shape, idx));
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    for (; d >= 0; --d) {
      const auto u = static_cast<size_t>(d);
      if (++idx[u] < b.offsets[u] + b.sizes[u]) break;
      idx[u] = b.offsets[u];
    }
    if (d < 0) return out;
  }
}

// An iota tensor (float values 0, 1, 2, ...) of `shape`: every element names its place.
Tensor iota(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0f);
  return td::from_vector<float>(v, shape);
}

Tensor narrow_box(Tensor t, const ck::Box& b) {
  for (size_t d = 0; d < b.offsets.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), b.offsets[d], b.sizes[d]);
  return t;
}

}  // namespace

// Property: the boxes of a flat range cover exactly its elements, in order, each box a run of
// consecutive flat indices; at most 2 x rank - 1 boxes. Checked on random shapes and ranges.
TEST(ShardedState, FlatRangeBoxesCoverTheRangeInOrder) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    Shape shape;
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) {
      shape.push_back(1 + static_cast<int64_t>(rng() % 5));
      n *= shape.back();
    }
    int64_t b = static_cast<int64_t>(rng() % static_cast<uint32_t>(n + 1));
    int64_t e = static_cast<int64_t>(rng() % static_cast<uint32_t>(n + 1));
    if (b > e) std::swap(b, e);
    const std::vector<ck::Box> boxes = ck::flat_range_boxes(shape, b, e);
    EXPECT_LE(static_cast<int64_t>(boxes.size()), 2 * rank - 1);
    int64_t next = b;
    for (const ck::Box& box : boxes) {
      for (int64_t f : box_flat(shape, box)) ASSERT_EQ(f, next++) << td::shape_str(shape);
    }
    EXPECT_EQ(next, e) << td::shape_str(shape) << " [" << b << ", " << e << ")";
  }
  EXPECT_NE(error_of([] {
              ck::flat_range_boxes({2, 3}, 4, 7);
            }).find("is not inside the 6"),
            std::string::npos);
}

// Property: a tensor-parallel shard (fused QKV-like segments, a padded vocabulary) maps each of
// its pieces onto the full tensor exactly as ShardSpec::take copies them, and the shards of all
// ranks cover the full tensor once, padding left out.
TEST(ShardedState, ShardPlacementMatchesTake) {
  std::vector<std::pair<td::nn::ShardSpec, Shape>> cases;
  cases.emplace_back(td::nn::ShardSpec{0, {8, 4, 4}, 2, 0}, Shape{16, 3});
  cases.emplace_back(td::nn::ShardSpec{0, {8, 4, 4}, 2, 1}, Shape{16, 3});
  cases.emplace_back(td::nn::ShardSpec::split(1, 6, 3, 2), Shape{2, 6});
  cases.emplace_back(td::nn::ShardSpec::split(0, 12, 4, 3), Shape{10, 2});  // padding only
  cases.emplace_back(td::nn::ShardSpec::split(0, 12, 4, 0), Shape{10, 2});
  for (const auto& [spec, shape] : cases) {
    const Tensor full = iota(shape);
    const Tensor shard = spec.take(full);
    for (const ck::BoxMap& m : ck::shard_placement(spec, shape)) {
      EXPECT_TRUE(same_bytes(narrow_box(shard, m.local).contiguous(),
                             narrow_box(full, m.global).contiguous()))
          << spec.str() << " " << m.global.str();
    }
  }
  // Every element of a padded vocabulary table once over the 4 ranks.
  const Shape full = {10, 2};
  std::vector<int> hits(20, 0);
  for (int r = 0; r < 4; ++r) {
    for (const ck::BoxMap& m : ck::shard_placement(td::nn::ShardSpec::split(0, 12, 4, r), full))
      for (int64_t f : box_flat(full, m.global)) ++hits[static_cast<size_t>(f)];
  }
  for (int h : hits) EXPECT_EQ(h, 1);
}

// Property: pieces saved by one layout are read back exactly by another: a [16, 6] weight saved
// as 2 tensor-parallel shards (QKV-like segments, dim 0) plus ZeRO flat shards of a [5, 7]
// moment over 3 ranks is read as 4 column shards / any box / the whole tensor, bit for bit;
// a replicated tensor saved by two ranks reads once.
TEST(ShardedState, PiecesSavedByOneLayoutReadByAnother) {
  td::test::TempDir dir;
  const Tensor w = iota({16, 6}), m = td::mul(iota({5, 7}), 0.5), b = iota({6});
  {
    ck::CheckpointWriter w0(dir.path("ck"));
    ck::CheckpointWriter w1(dir.path("ck"), 1);
    ck::CheckpointWriter w2(dir.path("ck"), 2);
    ck::CheckpointWriter* ws[3] = {&w0, &w1, &w2};
    std::vector<ck::GlobalPiece> pieces[3];
    for (int r = 0; r < 2; ++r) {
      const td::nn::ShardSpec spec{0, {8, 4, 4}, 2, r};
      const Tensor local = spec.take(w);
      for (const ck::BoxMap& mp : ck::shard_placement(spec, w.sizes()))
        pieces[r].push_back({"w", w.sizes(), mp.global, narrow_box(local, mp.local).contiguous()});
      pieces[r].push_back({"b", b.sizes(), ck::Box::whole(b.sizes()), b});  // replicas
    }
    const int64_t n = m.numel(), per = (n + 2) / 3;  // ZeRO: flat shards of 12, 12, 11
    for (int r = 0; r < 3; ++r) {
      const int64_t lo = r * per, hi = std::min(n, lo + per);
      for (const ck::Box& box : ck::flat_range_boxes(m.sizes(), lo, hi))
        pieces[r].push_back({"m", m.sizes(), box, narrow_box(m, box).contiguous()});
    }
    for (int r = 2; r >= 0; --r) {
      ck::write_pieces(*ws[r], r, pieces[r]);
      if (r > 0) ws[r]->finish();
    }
    w0.commit(td::json::Object{}, 3);
  }
  ck::CheckpointReader reader(dir.path("ck"));
  ck::PieceIndex idx(reader);
  EXPECT_EQ(idx.names(), (std::vector<std::string>{"b", "m", "w"}));
  EXPECT_EQ(idx.global_shape("w"), (Shape{16, 6}));
  EXPECT_TRUE(same_bytes(idx.read_full("w"), w));
  EXPECT_TRUE(same_bytes(idx.read_full("m"), m));
  EXPECT_TRUE(same_bytes(idx.read_full("b"), b));
  for (int r = 0; r < 3; ++r) {  // column shards: boxes across every saved piece
    const ck::Box col{{0, 2 * r}, {16, 2}};
    EXPECT_TRUE(same_bytes(idx.read("w", col), narrow_box(w, col).contiguous())) << r;
  }
  const ck::Box odd{{1, 2}, {3, 5}};
  EXPECT_TRUE(same_bytes(idx.read("m", odd), narrow_box(m, odd).contiguous()));

  EXPECT_NE(error_of([&] { idx.read("nope", ck::Box::whole({1})); }).find("holds no tensor 'nope'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              idx.read("w", ck::Box{{10, 0}, {7, 6}});
            }).find("is not inside 'w'"),
            std::string::npos);
}

// Property: a tensor whose saved pieces do not cover a requested box (a rank's shard missing)
// is an error naming the tensor and the shortfall, and write_pieces refuses malformed pieces.
TEST(ShardedState, MissingCoverageAndBadPiecesAreErrors) {
  td::test::TempDir dir;
  const Tensor w = iota({4, 3});
  {
    ck::CheckpointWriter w0(dir.path("ck"));
    // Only the first two rows were saved.
    ck::write_pieces(w0, 0, {{"w", w.sizes(), {{0, 0}, {2, 3}}, w.narrow(0, 0, 2).contiguous()}});
    const ck::GlobalPiece outside{"w", w.sizes(), {{3, 0}, {2, 3}}, td::zeros({2, 3})};
    EXPECT_NE(error_of([&] { ck::write_pieces(w0, 1, {outside}); }).find("is not inside its"),
              std::string::npos);
    const ck::GlobalPiece wrong{"w", w.sizes(), {{0, 0}, {2, 3}}, td::zeros({3, 2})};
    EXPECT_NE(error_of([&] { ck::write_pieces(w0, 1, {wrong}); }).find("not the box's shape"),
              std::string::npos);
    const ck::GlobalPiece p{"w", w.sizes(), {{2, 0}, {1, 3}}, td::zeros({1, 3})};
    EXPECT_NE(error_of([&] {
                ck::write_pieces(w0, 1, {p, p});
              }).find("given twice"),
              std::string::npos);
    w0.commit();
  }
  ck::CheckpointReader reader(dir.path("ck"));
  ck::PieceIndex idx(reader);
  EXPECT_TRUE(same_bytes(idx.read("w", {{0, 0}, {2, 3}}), w.narrow(0, 0, 2).contiguous()));
  const std::string e = error_of([&] { idx.read_full("w"); });
  EXPECT_NE(e.find("cover 6 of the 12 elements of [0:4, 0:3]"), std::string::npos) << e;
}
