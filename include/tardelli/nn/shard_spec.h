#pragma once
// td::nn::ShardSpec: where one rank's shard of a parameter lies in the full (logical) tensor.
//
// Note [Shard specs]: a parallel layout splits a parameter along one dim. The full tensor's
// extent along that dim is a sequence of `segments` (one for a plain column- or row-parallel
// weight; three for a fused QKV weight: q rows, k rows, v rows; two for SwiGLU's gate and up
// rows), each cut into `parts` equal pieces; rank `index` holds piece `index` of every segment,
// concatenated in segment order. So a fused QKV shard holds its own heads of q, k and v, and the
// local forward narrows it exactly as the full model narrows the full weight. The segments may
// add up to more than the full tensor's extent: the missing tail is zero padding (a vocabulary
// padded to a multiple of the tp size), which take() fills with zeros and put() drops.
// Checkpoints record the spec of every shard (to_json), which is all a later resharding needs.
#include <cstdint>
#include <string>
#include <vector>

#include "tardelli/core/json.h"
#include "tardelli/core/tensor.h"

namespace td::nn {

struct ShardSpec {
  int64_t dim = -1;               // the split dim; -1: replicated (every rank holds it all)
  std::vector<int64_t> segments;  // extents along dim of the full (padded) tensor, in order
  int parts = 1;                  // pieces per segment (the tp size)
  int index = 0;                  // the piece this rank holds

  static ShardSpec replicated_spec() { return {}; }
  // One segment of `extent` along `dim`, split into `parts`.
  static ShardSpec split(int64_t dim, int64_t extent, int parts, int index);

  bool replicated() const { return dim < 0 || parts == 1; }
  // The shard's shape for a full tensor of shape `full`; td::Error naming the spec and shape
  // when the segments do not divide by parts or do not cover the dim.
  Shape shard_shape(const Shape& full) const;
  // This rank's shard of `full`: a detached, contiguous copy (zero rows for padding).
  Tensor take(const Tensor& full) const;
  // Writes `shard` into its place in `full` (the inverse of take; padding dropped).
  void put(const Tensor& shard, Tensor& full) const;

  json::Value to_json() const;  // {"dim", "segments", "parts", "index"}
  static ShardSpec from_json(const json::Value& v);
  std::string str() const;  // "replicated" or "dim 0 segments [384, 128, 128] / 2, piece 1"
  bool operator==(const ShardSpec& o) const = default;
};

}  // namespace td::nn
