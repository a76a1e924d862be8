#include "tardelli/checkpoint/sharded_state.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>
#include <sstream>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/checkpoint/safetensors.h"
#include "tardelli/core/json.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/factory.h"

namespace td::checkpoint {

// ---- boxes ----

Box Box::whole(const Shape& shape) {
  return {std::vector<int64_t>(shape.size(), 0), std::vector<int64_t>(shape.begin(), shape.end())};
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

Box Box::intersect(const Box& o) const {
  TD_CHECK(offsets.size() == o.offsets.size(), "Box.intersect: boxes of rank ", offsets.size(),
           " and ", o.offsets.size());
  Box out;
  for (size_t d = 0; d < offsets.size(); ++d) {
    const int64_t lo = std::max(offsets[d], o.offsets[d]);
    const int64_t hi = std::min(offsets[d] + sizes[d], o.offsets[d] + o.sizes[d]);
    out.offsets.push_back(lo);
    out.sizes.push_back(std::max<int64_t>(0, hi - lo));
  }
  return out;
}

std::string Box::str() const {
  std::ostringstream s;
  s << "[";
  for (size_t d = 0; d < offsets.size(); ++d)
    s << (d ? ", " : "") << offsets[d] << ":" << offsets[d] + sizes[d];
  s << "]";
  return s.str();
}

std::vector<BoxMap> shard_placement(const nn::ShardSpec& spec, const Shape& full) {
  const Box all = Box::whole(full);
  if (spec.replicated()) return {{all, all}};
  const Shape local = spec.shard_shape(full);  // validates the spec against `full`
  const auto dim = static_cast<size_t>(spec.dim);
  std::vector<BoxMap> out;
  int64_t seg_start = 0, dst = 0;
  for (int64_t seg : spec.segments) {
    const int64_t k = seg / spec.parts, lo = seg_start + spec.index * k;
    const int64_t hi = std::min(lo + k, full[dim]);  // beyond: padding, never saved
    if (hi > lo) {
      BoxMap m{Box::whole(local), all};
      m.local.offsets[dim] = dst;
      m.local.sizes[dim] = hi - lo;
      m.global.offsets[dim] = lo;
      m.global.sizes[dim] = hi - lo;
      out.push_back(std::move(m));
    }
    seg_start += seg;
    dst += k;
  }
  return out;
}

std::vector<BoxMap> shift_placement(std::vector<BoxMap> placement, int64_t dim, int64_t offset) {
  for (auto& m : placement) {
    TD_CHECK(dim >= 0 && dim < static_cast<int64_t>(m.global.offsets.size()),
             "shift_placement: dim ", dim, " of a rank-", m.global.offsets.size(), " box");
    m.global.offsets[static_cast<size_t>(dim)] += offset;
  }
  return placement;
}

// Note [Flat ranges as boxes]: elements [b, e) of a row-major tensor split into (1) the rest of
// b's innermost row, (2) whole rows up to the next boundary of the dim above, ... then the
// mirror image on the way down to e. Recursively: peel off leading dim 0 indices. A range that
// starts and ends on dim-0 boundaries is one box.
namespace {

void flat_boxes(const Shape& shape, size_t d, std::vector<int64_t> prefix, int64_t b, int64_t e,
                std::vector<Box>& out) {
  if (b >= e) return;
  const size_t rank = shape.size();
  int64_t inner = 1;  // elements per index of dim d
  for (size_t k = d + 1; k < rank; ++k) inner *= shape[k];
  const auto emit = [&](int64_t lo, int64_t n) {  // indices [lo, lo+n) of dim d, all inner
    Box box;
    box.offsets = prefix;
    box.sizes.assign(prefix.size(), 1);
    box.offsets.push_back(lo);
    box.sizes.push_back(n);
    for (size_t k = d + 1; k < rank; ++k) {
      box.offsets.push_back(0);
      box.sizes.push_back(shape[k]);
    }
    out.push_back(std::move(box));
  };
  const int64_t first = b / inner, last = (e - 1) / inner;  // dim-d indices touched
  if (b % inner == 0 && e % inner == 0) {
    emit(first, last - first + 1);
    return;
  }
  if (first == last) {  // inside one index of dim d: recurse into it
    prefix.push_back(first);
    flat_boxes(shape, d + 1, prefix, b - first * inner, e - first * inner, out);
    return;
  }
  int64_t lo = first;
  if (b % inner != 0) {  // the partial head
    std::vector<int64_t> p = prefix;
    p.push_back(first);
    flat_boxes(shape, d + 1, p, b - first * inner, inner, out);
    lo = first + 1;
  }
  const int64_t hi = e % inner == 0 ? last + 1 : last;  // whole indices [lo, hi)
  if (hi > lo) emit(lo, hi - lo);
  if (e % inner != 0) {  // the partial tail
    std::vector<int64_t> p = prefix;
    p.push_back(last);
    flat_boxes(shape, d + 1, p, 0, e - last * inner, out);
  }
}

}  // namespace

std::vector<Box> flat_range_boxes(const Shape& shape, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  TD_CHECK(0 <= begin && begin <= end && end <= n, "flat_range_boxes: range [", begin, ", ", end,
           ") is not inside the ", n, " elements of ", shape_str(shape));
  std::vector<Box> out;
  if (shape.empty()) {
    if (end > begin) out.push_back(Box{});
    return out;
  }
  flat_boxes(shape, 0, {}, begin, end, out);
  return out;
}

std::vector<BoxMap> map_local_box(const std::vector<BoxMap>& placement, const Box& local) {
  std::vector<BoxMap> out;
  for (const BoxMap& m : placement) {
    Box part = m.local.intersect(local);
    if (part.empty()) continue;
    BoxMap r{part, m.global};
    for (size_t d = 0; d < part.offsets.size(); ++d) {
      r.global.offsets[d] = m.global.offsets[d] + (part.offsets[d] - m.local.offsets[d]);
      r.global.sizes[d] = part.sizes[d];
    }
    out.push_back(std::move(r));
  }
  return out;
}

// ---- writing ----

namespace {

std::string rank_name(const char* fmt, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, rank);
  return buf;
}

json::Value ints(const std::vector<int64_t>& v) {
  json::Array a;
  for (int64_t x : v) a.emplace_back(x);
  return a;
}

std::vector<int64_t> ints_of(const json::Value& v) {
  std::vector<int64_t> out;
  for (const auto& x : v.as_array()) out.push_back(x.as_int());
  return out;
}

std::string piece_key(const std::string& name, const Box& box) {
  std::string k = name + "@";
  for (size_t d = 0; d < box.offsets.size(); ++d) {
    if (d) k += ',';
    k += std::to_string(box.offsets[d]);
  }
  return k;
}

bool inside(const Box& box, const Shape& shape) {
  if (box.offsets.size() != shape.size() || box.sizes.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.sizes[d] < 0 || box.offsets[d] + box.sizes[d] > shape[d])
      return false;
  }
  return true;
}

}  // namespace

std::string shard_data_file(int rank) {
  return rank_name("shards.rank%05d.safetensors", rank);
}

std::string shard_index_file(int rank) {
  return rank_name("shards.rank%05d.index.json", rank);
}

void write_pieces(CheckpointWriter& w, int rank, const std::vector<GlobalPiece>& pieces) {
  NamedTensors data;
  json::Array index;
  std::set<std::string> keys;
  for (const GlobalPiece& p : pieces) {
    TD_CHECK(p.data.defined(), "write_pieces: piece '", p.name, "' ", p.box.str(), " has no data");
    TD_CHECK(inside(p.box, p.global_shape), "write_pieces: piece '", p.name, "' box ", p.box.str(),
             " is not inside its global shape ", shape_str(p.global_shape));
    TD_CHECK(p.data.sizes() == Shape(p.box.sizes.begin(), p.box.sizes.end()),
             "write_pieces: piece '", p.name, "' ", p.box.str(), " holds ", describe(p.data),
             ", not the box's shape");
    const std::string key = piece_key(p.name, p.box);
    TD_CHECK(keys.insert(key).second, "write_pieces: piece '", p.name, "' ", p.box.str(),
             " given twice");
    data.emplace_back(key, p.data);
    index.push_back(json::Object{{"name", p.name},
                                 {"key", key},
                                 {"shape", ints(p.global_shape)},
                                 {"offsets", ints(p.box.offsets)},
                                 {"sizes", ints(p.box.sizes)},
                                 {"dtype", safetensors_dtype_name(p.data.dtype())}});
  }
  w.write_tensors(shard_data_file(rank), data);
  w.write_bytes(shard_index_file(rank), json::dump(json::Object{{"pieces", index}}) + "\n");
}

// ---- reading ----

PieceIndex::PieceIndex(const CheckpointReader& reader) : reader_(&reader) {
  const std::string prefix = "shards.rank", suffix = ".index.json";
  for (const FileEntry& f : reader.files()) {
    const std::string& n = f.name;
    if (n.size() <= prefix.size() + suffix.size() || n.compare(0, prefix.size(), prefix) != 0 ||
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string data_file = n.substr(0, n.size() - suffix.size()) + ".safetensors";
    json::Value idx;
    try {
      idx = json::parse(reader.read_bytes(n));
    } catch (const Error& e) {
      TD_ERROR("checkpoint '", reader.path(), "': index file '", n, "' is malformed: ", e.what());
    }
    TD_CHECK(reader.has_file(data_file), "checkpoint '", reader.path(), "': index file '", n,
             "' has no data file '", data_file, "'");
    for (const json::Value& p : idx.at("pieces").as_array()) {
      const std::string name = p.at("name").as_string();
      const std::vector<int64_t> shape = ints_of(p.at("shape"));
      Entry e{
          data_file, p.at("key").as_string(), {ints_of(p.at("offsets")), ints_of(p.at("sizes"))}};
      const DType dt = safetensors_dtype(p.at("dtype").as_string());
      TD_CHECK(inside(e.box, Shape(shape.begin(), shape.end())), "checkpoint '", reader.path(),
               "': '", n, "': piece '", name, "' ", e.box.str(), " lies outside its shape ",
               shape_str(Shape(shape.begin(), shape.end())));
      auto [it, fresh] =
          tensors_.try_emplace(name, Info{Shape(shape.begin(), shape.end()), dt, {}});
      TD_CHECK(fresh || (it->second.shape == Shape(shape.begin(), shape.end()) &&
                         it->second.dtype == dt),
               "checkpoint '", reader.path(), "': the pieces of '", name,
               "' disagree on its global shape or dtype (", shape_str(it->second.shape), " ",
               dtype_name(it->second.dtype), " vs ", shape_str(Shape(shape.begin(), shape.end())),
               " ", dtype_name(dt), " in '", n, "')");
      it->second.pieces.push_back(std::move(e));
    }
  }
  // Note [Whole-tensor checkpoints]: a checkpoint without shard files (the single-process
  // layout of format 1: examples/train_gpt.cpp, or a one-rank Python run before the sharded
  // format) holds whole tensors in model.safetensors and optimizer.safetensors; each tensor is
  // then one piece covering all of it, so such a checkpoint loads into any layout too.
  if (!tensors_.empty()) return;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    if (!reader.has_file(f)) continue;
    auto file = std::make_shared<SafetensorsFile>(reader.read_tensors(f));
    files_[f] = file;
    for (const auto& [name, t] : file->tensors) {
      TD_CHECK(tensors_.count(name) == 0, "checkpoint '", reader.path(), "': tensor '", name,
               "' is in both model.safetensors and optimizer.safetensors");
      tensors_[name] = Info{t.sizes(), t.dtype(), {Entry{f, name, Box::whole(t.sizes())}}};
    }
  }
}

bool PieceIndex::has(const std::string& name) const {
  return tensors_.count(name) != 0;
}

std::vector<std::string> PieceIndex::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : tensors_) out.push_back(n);
  return out;
}

const PieceIndex::Info& PieceIndex::info(const std::string& name) const {
  auto it = tensors_.find(name);
  TD_CHECK(it != tensors_.end(), "checkpoint '", reader_->path(), "' holds no tensor '", name,
           "' (", tensors_.size(), " tensors saved)");
  return it->second;
}

Shape PieceIndex::global_shape(const std::string& name) const {
  return info(name).shape;
}

DType PieceIndex::dtype(const std::string& name) const {
  return info(name).dtype;
}

Tensor PieceIndex::read(const std::string& name, const Box& box) const {
  const Info& in = info(name);
  TD_CHECK(inside(box, in.shape), "checkpoint '", reader_->path(), "': box ", box.str(),
           " is not inside '", name, "' of shape ", shape_str(in.shape));
  autograd::NoGradGuard ng;
  Tensor out = zeros(Shape(box.sizes.begin(), box.sizes.end()), {in.dtype, kCPU, false});
  int64_t covered = 0;
  std::vector<Box> seen;  // replicas saved the same box: read it once
  for (const Entry& e : in.pieces) {
    const Box part = e.box.intersect(box);
    if (part.empty() || std::find(seen.begin(), seen.end(), e.box) != seen.end()) continue;
    seen.push_back(e.box);
    auto& file = files_[e.file];
    if (!file) file = std::make_shared<SafetensorsFile>(reader_->read_tensors(e.file));
    Tensor src = file->at(e.key);
    Tensor dst = out;
    for (size_t d = 0; d < part.offsets.size(); ++d) {
      const auto dd = static_cast<int64_t>(d);
      src = src.narrow(dd, part.offsets[d] - e.box.offsets[d], part.sizes[d]);
      dst = dst.narrow(dd, part.offsets[d] - box.offsets[d], part.sizes[d]);
    }
    dst.copy_(src);
    covered += part.numel();
  }
  TD_CHECK(covered == box.numel(), "checkpoint '", reader_->path(), "': the saved pieces of '",
           name, "' cover ", covered, " of the ", box.numel(), " elements of ", box.str(),
           " (a missing or incomplete shard file?)");
  return out;
}

Tensor PieceIndex::read_full(const std::string& name) const {
  return read(name, Box::whole(info(name).shape));
}

void PieceIndex::release() const {
  files_.clear();
}

}  // namespace td::checkpoint
