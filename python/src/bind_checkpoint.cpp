// tardelli._C.checkpoint: checkpoint directories (checkpoint/checkpoint.h), the pieces of
// layout-independent checkpoints (checkpoint/sharded_state.h: boxes cross as (offsets, sizes)
// tuples) and the GPTConfig JSON of the training-state layout (checkpoint/training_state.h). Type
// conversion only: JSON crosses as text (python/tardelli/checkpoint.py turns it into dicts),
// tensors as [(name, Tensor)].
#include "bind.h"
#include "tardelli/checkpoint/checkpoint.h"
#include "tardelli/checkpoint/sharded_state.h"
#include "tardelli/checkpoint/training_state.h"
#include "tardelli/ops/copy.h"

namespace td::python {

using namespace pybind11::literals;

namespace {

py::dict entry_dict(const checkpoint::FileEntry& e) {
  py::dict d;
  d["name"] = e.name;
  d["size"] = e.size;
  d["crc32"] = e.crc32;
  d["writer"] = e.writer;
  return d;
}

py::list entry_list(const std::vector<checkpoint::FileEntry>& es) {
  py::list l;
  for (const auto& e : es) l.append(entry_dict(e));
  return l;
}

}  // namespace

void init_checkpoint(py::module_& m, TensorClass& /*cls*/) {
  namespace ck = checkpoint;
  py::module_ cm = m.def_submodule("checkpoint", "checkpoint directories (C++)");

  py::class_<ck::CheckpointWriter>(cm, "CheckpointWriter")
      .def(py::init<std::string, int>(), "final_dir"_a, "writer_id"_a = 0, nogil())
      .def("write_tensors", &ck::CheckpointWriter::write_tensors, "file_name"_a, "tensors"_a,
           "metadata"_a = std::map<std::string, std::string>{}, nogil())
      .def(
          "write_bytes",
          [](ck::CheckpointWriter& w, const std::string& name, const py::bytes& data) {
            std::string bytes = data;  // copied under the GIL
            py::gil_scoped_release release;
            w.write_bytes(name, bytes);
          },
          "file_name"_a, "data"_a)
      .def("copy_file", &ck::CheckpointWriter::copy_file, "file_name"_a, "src_path"_a, nogil())
      .def("finish", &ck::CheckpointWriter::finish, nogil())
      .def(
          "commit",
          [](ck::CheckpointWriter& w, const std::string& meta_json, int num_writers) {
            json::Value meta = json::parse(meta_json);
            return w.commit(meta, num_writers);
          },
          "meta_json"_a, "num_writers"_a = 1, nogil())
      .def_property_readonly("final_dir", &ck::CheckpointWriter::final_dir)
      .def_property_readonly("tmp_dir", &ck::CheckpointWriter::tmp_dir)
      .def_property_readonly("writer_id", &ck::CheckpointWriter::writer_id)
      .def_property_readonly("entries",
                             [](const ck::CheckpointWriter& w) { return entry_list(w.entries()); });

  py::class_<ck::CheckpointReader>(cm, "CheckpointReader")
      .def(py::init<const std::string&>(), "dir"_a, nogil())
      .def_property_readonly("path", &ck::CheckpointReader::path)
      .def("meta_json", [](const ck::CheckpointReader& r) { return json::dump(r.meta()); })
      .def("files", [](const ck::CheckpointReader& r) { return entry_list(r.files()); })
      .def("has_file", &ck::CheckpointReader::has_file, "name"_a)
      .def("verify", &ck::CheckpointReader::verify, nogil())
      .def(
          "read_tensors",
          [](const ck::CheckpointReader& r, const std::string& name) {
            ck::SafetensorsFile f;
            {
              py::gil_scoped_release release;
              f = r.read_tensors(name);
            }
            return py::make_tuple(py::cast(f.tensors), py::cast(f.metadata));
          },
          "name"_a, "([(name, tensor)] in file order, metadata dict)")
      .def(
          "read_bytes",
          [](const ck::CheckpointReader& r, const std::string& name) {
            std::string bytes;
            {
              py::gil_scoped_release release;
              bytes = r.read_bytes(name);
            }
            return py::bytes(bytes);
          },
          "name"_a);

  using BoxPair = std::pair<std::vector<int64_t>, std::vector<int64_t>>;  // (offsets, sizes)
  using MapPair = std::pair<BoxPair, BoxPair>;                            // (local, global)
  const auto box_of = [](const BoxPair& b) { return ck::Box{b.first, b.second}; };
  const auto pair_of = [](const ck::Box& b) { return BoxPair{b.offsets, b.sizes}; };
  const auto maps_of = [pair_of](const std::vector<ck::BoxMap>& ms) {
    std::vector<MapPair> out;
    for (const auto& m : ms) out.emplace_back(pair_of(m.local), pair_of(m.global));
    return out;
  };
  cm.def(
      "shard_placement",
      [maps_of](int64_t dim, const std::vector<int64_t>& segments, int parts, int index,
                const Shape& full) {
        return maps_of(ck::shard_placement(nn::ShardSpec{dim, segments, parts, index}, full));
      },
      "dim"_a, "segments"_a, "parts"_a, "index"_a, "full_shape"_a);
  cm.def(
      "flat_range_boxes",
      [pair_of](const Shape& shape, int64_t begin, int64_t end) {
        std::vector<BoxPair> out;
        for (const auto& b : ck::flat_range_boxes(shape, begin, end)) out.push_back(pair_of(b));
        return out;
      },
      "shape"_a, "begin"_a, "end"_a);
  cm.def(
      "map_local_box",
      [box_of, maps_of](const std::vector<MapPair>& placement, const BoxPair& local) {
        std::vector<ck::BoxMap> ps;
        for (const auto& [l, g] : placement) ps.push_back({box_of(l), box_of(g)});
        return maps_of(ck::map_local_box(ps, box_of(local)));
      },
      "placement"_a, "local"_a);
  // pieces: [(name, global_shape, (offsets, sizes), tensor)]
  cm.def(
      "write_pieces",
      [box_of](ck::CheckpointWriter& w, int rank,
               const std::vector<std::tuple<std::string, Shape, BoxPair, Tensor>>& pieces) {
        std::vector<ck::GlobalPiece> ps;
        for (const auto& [n, shape, box, t] : pieces) ps.push_back({n, shape, box_of(box), t});
        py::gil_scoped_release release;
        ck::write_pieces(w, rank, ps);
      },
      "writer"_a, "rank"_a, "pieces"_a);
  py::class_<ck::PieceIndex>(cm, "PieceIndex")
      .def(py::init<const ck::CheckpointReader&>(), "reader"_a, py::keep_alive<1, 2>(), nogil())
      .def("has", &ck::PieceIndex::has, "name"_a)
      .def("names", &ck::PieceIndex::names)
      .def("global_shape", &ck::PieceIndex::global_shape, "name"_a)
      .def(
          "dtype",
          [](const ck::PieceIndex& x, const std::string& name) {
            return std::string(ck::safetensors_dtype_name(x.dtype(name)));
          },
          "name"_a)
      .def(
          "read",
          [box_of](const ck::PieceIndex& x, const std::string& name, const BoxPair& box) {
            py::gil_scoped_release release;
            return x.read(name, box_of(box));
          },
          "name"_a, "box"_a)
      .def("read_full", &ck::PieceIndex::read_full, "name"_a, nogil())
      .def("release", &ck::PieceIndex::release);

  // Asynchronous saves (ops/copy.h: Note [Host snapshot]).
  cm.def("host_snapshot", &host_snapshot, "tensor"_a, nogil());
  cm.def("wait_host_snapshot", &wait_host_snapshot, "device"_a, nogil());
  cm.def("step_dir_name", &ck::step_dir_name, "step"_a);
  cm.def("update_latest", &ck::update_latest, "root"_a, "name"_a, nogil());
  cm.def("find_latest", &ck::find_latest, "root"_a, nogil());
  cm.def(
      "crc32",
      [](const py::bytes& data, uint32_t crc) {
        std::string_view v = data;
        return ck::crc32(v.data(), v.size(), crc);
      },
      "data"_a, "crc"_a = 0);
  cm.def(
      "config_to_json",
      [](const models::GPTConfig& c) { return json::dump(ck::config_to_json(c)); }, "config"_a);
  cm.def(
      "config_from_json",
      [](const std::string& text) { return ck::config_from_json(json::parse(text)); }, "text"_a);
  cm.def("load_model_state", &ck::load_model_state, "reader"_a, "model"_a, nogil());
  cm.attr("FORMAT_NAME") = ck::kFormatName;
  cm.attr("FORMAT_VERSION") = ck::kFormatVersion;
  cm.attr("MODEL_FILE") = ck::kModelFile;
  cm.attr("OPTIMIZER_FILE") = ck::kOptimizerFile;
}

}  // namespace td::python
