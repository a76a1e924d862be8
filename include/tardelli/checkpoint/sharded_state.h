#pragma once
// Layout-independent (resharding) checkpoints: every rank saves the parts of global tensors it
// holds, each tagged with the region of the global tensor it covers, and a loading rank reads
// the regions its own layout needs, whatever layout wrote them (torch DCP's and Megatron's
// dist-checkpointing idea, in our own format).
//
// Note [Global pieces]: a parallel layout gives a rank parts of logical ("global") tensors: a
// tensor-parallel shard (nn::ShardSpec: one piece per segment, vocabulary padding clipped), an
// expert-parallel slice (dim 0), a ZeRO shard (a flat element range of the rank's local tensor),
// or all of it (replicated). Each part is a set of boxes of the global tensor: a box is an
// offset and a size per dim. A rank saves a list of pieces (global name, global shape, box,
// data of the box's shape) into
//   shards.rankNNNNN.safetensors   the data, one entry per piece, key "<name>@<offsets>"
//   shards.rankNNNNN.index.json    {"pieces": [{"name", "key", "shape", "offsets", "sizes",
//                                                "dtype"}, ...]}
// (both written through a CheckpointWriter: atomic, CRC-checked). Replicas save a box once (the
// caller picks one writer per box). PieceIndex reads every index file of a checkpoint, and
// read(name, box) assembles any box from the saved pieces that intersect it: a layout's shards
// are just boxes to read. Pieces of one tensor are identical boxes (replicas, read once) or
// disjoint; a box that the pieces do not cover entirely is a td::Error naming the tensor, the
// box and how much is missing.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/checkpoint/checkpoint.h"
#include "tardelli/core/tensor.h"
#include "tardelli/nn/shard_spec.h"

namespace td::checkpoint {

// A region of a tensor: [offsets[d], offsets[d] + sizes[d]) along every dim d.
struct Box {
  std::vector<int64_t> offsets, sizes;

  static Box whole(const Shape& shape);  // offsets 0, sizes = shape
  int64_t numel() const;
  // The intersection with `o` (sizes 0 where they do not meet); same rank required.
  Box intersect(const Box& o) const;
  bool empty() const { return numel() == 0; }
  std::string str() const;  // "[0:4, 8:16]"
  bool operator==(const Box& o) const = default;
};

// A local box and the global box it is (equal sizes).
struct BoxMap {
  Box local, global;
};

// Where a tensor-parallel shard of a tensor of full shape `full` lies: one BoxMap per segment
// piece of `spec` (Note [Shard specs]), the zero padding beyond the full extent left out;
// replicated: the whole tensor onto itself.
std::vector<BoxMap> shard_placement(const nn::ShardSpec& spec, const Shape& full);
// The same placement shifted by `offset` along `dim` of the global tensor (an expert-parallel
// slice of dim 0 is the placement {whole box -> offset rank * E/ep}); the global shape grows
// accordingly at the caller.
std::vector<BoxMap> shift_placement(std::vector<BoxMap> placement, int64_t dim, int64_t offset);
// Boxes of a contiguous tensor of `shape` that cover its flat (row-major) elements
// [begin, end) exactly, in order, each contiguous in flat order (at most 2 x rank - 1 boxes).
std::vector<Box> flat_range_boxes(const Shape& shape, int64_t begin, int64_t end);
// The parts of local box `local` under `placement`: for each BoxMap that meets it, the
// intersection and its global image.
std::vector<BoxMap> map_local_box(const std::vector<BoxMap>& placement, const Box& local);

// One saved piece: global tensor `name` of shape `global_shape`, region `box`, values `data`
// (shape box.sizes).
struct GlobalPiece {
  std::string name;
  Shape global_shape;
  Box box;
  Tensor data;
};

// The file names of writer `rank`'s pieces.
std::string shard_data_file(int rank);
std::string shard_index_file(int rank);
// Writes `pieces` as writer w's shards.rankNNNNN files (Note [Global pieces]). Checks that each
// piece's data has its box's shape, the box lies inside the global shape, and no (name, box) is
// given twice.
void write_pieces(CheckpointWriter& w, int rank, const std::vector<GlobalPiece>& pieces);

class PieceIndex {
 public:
  // Reads every shards.*.index.json of `reader` (the reader must outlive the index); without
  // any, the whole tensors of model.safetensors and optimizer.safetensors (Note [Whole-tensor
  // checkpoints]). td::Error when a tensor's pieces disagree on its global shape or dtype.
  explicit PieceIndex(const CheckpointReader& reader);

  bool has(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  Shape global_shape(const std::string& name) const;
  DType dtype(const std::string& name) const;
  // The saved values of `name` in `box` (a fresh contiguous CPU tensor of shape box.sizes in
  // the saved dtype), assembled from every saved piece that meets the box. Data files are read
  // (CRC-checked) once and kept. td::Error: unknown name, a box outside the global shape, or
  // one the pieces do not cover.
  Tensor read(const std::string& name, const Box& box) const;
  Tensor read_full(const std::string& name) const;
  // Drops the data files read so far (memory).
  void release() const;

 private:
  struct Entry {
    std::string file, key;
    Box box;
  };
  struct Info {
    Shape shape;
    DType dtype;
    std::vector<Entry> pieces;
  };
  const Info& info(const std::string& name) const;

  const CheckpointReader* reader_;
  std::map<std::string, Info> tensors_;
  mutable std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;
};

}  // namespace td::checkpoint
