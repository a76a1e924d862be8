#include "tardelli/nn/shard_spec.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"

namespace td::nn {

namespace {

int64_t total(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), 0LL);
}

void check_layout(const ShardSpec& s, const Shape& full, const char* op) {
  TD_CHECK(s.parts >= 1 && s.index >= 0 && s.index < s.parts, op, ": piece ", s.index,
           " is not in [0, ", s.parts, ")");
  TD_CHECK(s.dim < static_cast<int64_t>(full.size()), op, ": ", s.str(), " splits dim ", s.dim,
           " of a tensor of shape ", shape_str(full));
  TD_CHECK(!s.segments.empty(), op, ": ", s.str(), " has no segments");
  for (int64_t seg : s.segments) {
    TD_CHECK(seg > 0 && seg % s.parts == 0, op, ": segment ", seg, " of ", s.str(),
             " is not a positive multiple of ", s.parts);
  }
  TD_CHECK(total(s.segments) >= full[s.dim], op, ": ", s.str(), " covers ", total(s.segments),
           " of the ", full[s.dim], " entries of dim ", s.dim, " of ", shape_str(full));
}

}  // namespace

ShardSpec ShardSpec::split(int64_t dim, int64_t extent, int parts, int index) {
  ShardSpec s;
  s.dim = dim;
  s.segments = {extent};
  s.parts = parts;
  s.index = index;
  return s;
}

Shape ShardSpec::shard_shape(const Shape& full) const {
  if (replicated()) return full;
  check_layout(*this, full, "ShardSpec.shard_shape");
  Shape out = full;
  out[dim] = total(segments) / parts;
  return out;
}

// Copies piece `index` of every segment: [seg_start + index*k, seg_start + (index+1)*k) of the
// full dim, clipped to the full tensor's extent (the rest stays zero: padding).
Tensor ShardSpec::take(const Tensor& full) const {
  TD_CHECK(full.defined(), "ShardSpec.take: the full tensor is undefined");
  autograd::NoGradGuard ng;
  if (replicated()) return full.detach().clone();
  Tensor out = zeros(shard_shape(full.sizes()), {full.dtype(), full.device(), false});
  int64_t seg_start = 0, dst = 0;
  for (int64_t seg : segments) {
    const int64_t k = seg / parts, lo = seg_start + index * k;
    const int64_t hi = std::min(lo + k, full.size(dim));
    if (hi > lo) out.narrow(dim, dst, hi - lo).copy_(full.detach().narrow(dim, lo, hi - lo));
    seg_start += seg;
    dst += k;
  }
  return out;
}

void ShardSpec::put(const Tensor& shard, Tensor& full) const {
  TD_CHECK(shard.defined() && full.defined(), "ShardSpec.put: undefined tensor");
  autograd::NoGradGuard ng;
  const Shape want = shard_shape(full.sizes());
  TD_CHECK(shard.sizes() == want, "ShardSpec.put: shard ", describe(shard), " does not have the ",
           shape_str(want), " that ", str(), " gives for a full ", describe(full));
  if (replicated()) {
    full.copy_(shard);
    return;
  }
  int64_t seg_start = 0, src = 0;
  for (int64_t seg : segments) {
    const int64_t k = seg / parts, lo = seg_start + index * k;
    const int64_t hi = std::min(lo + k, full.size(dim));
    if (hi > lo) full.narrow(dim, lo, hi - lo).copy_(shard.narrow(dim, src, hi - lo));
    seg_start += seg;
    src += k;
  }
}

json::Value ShardSpec::to_json() const {
  json::Array segs;
  for (int64_t s : segments) segs.emplace_back(s);
  return json::Object{{"dim", dim}, {"segments", segs}, {"parts", parts}, {"index", index}};
}

ShardSpec ShardSpec::from_json(const json::Value& v) {
  ShardSpec s;
  s.dim = v.at("dim").as_int();
  for (const auto& x : v.at("segments").as_array()) s.segments.push_back(x.as_int());
  s.parts = static_cast<int>(v.at("parts").as_int());
  s.index = static_cast<int>(v.at("index").as_int());
  return s;
}

std::string ShardSpec::str() const {
  if (replicated()) return "replicated";
  std::ostringstream os;
  os << "dim " << dim << " segments [";
  for (size_t i = 0; i < segments.size(); ++i) os << (i ? ", " : "") << segments[i];
  os << "] / " << parts << ", piece " << index;
  return os.str();
}

}  // namespace td::nn
