// tardelli._C.data: the Megatron-format indexed dataset, GPT samples and the prefetching loader
// (data/*.h). Type conversion only; td.data (python/tardelli/data) adds the Python sugar.
#include "bind.h"
#include "tardelli/data/data_loader.h"
#include "tardelli/data/gpt_dataset.h"
#include "tardelli/data/indexed_dataset.h"

namespace td::python {

using namespace pybind11::literals;
using data::DataLoader;
using data::GPTDataset;
using data::IndexedDataset;
using data::IndexedDatasetBuilder;

namespace {

using TokenArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

void add_sequence(IndexedDatasetBuilder& b, const TokenArray& tokens) {
  TD_CHECK(tokens.ndim() == 1, "IndexedDatasetBuilder.add_sequence: expected a 1-d sequence of ",
           "token ids, got ", tokens.ndim(), " dimensions");
  const int64_t* p = tokens.data();
  const auto n = static_cast<int64_t>(tokens.size());
  py::gil_scoped_release nogil;
  b.add_sequence(p, n);
}

}  // namespace

void init_data(py::module_& m, TensorClass& /*cls*/) {
  py::module_ dm = m.def_submodule("data", "Megatron-format datasets and the GPT loader (C++)");

  py::class_<IndexedDataset, std::shared_ptr<IndexedDataset>>(dm, "IndexedDataset")
      .def(py::init<const std::string&>(), "prefix"_a, nogil())
      .def("__len__", &IndexedDataset::num_sequences)
      .def_property_readonly("prefix", &IndexedDataset::prefix)
      .def_property_readonly("num_sequences", &IndexedDataset::num_sequences)
      .def_property_readonly("num_documents", &IndexedDataset::num_documents)
      .def_property_readonly("num_tokens", &IndexedDataset::num_tokens)
      .def_property_readonly("dtype_code", &IndexedDataset::token_dtype_code)
      .def("sequence_length", &IndexedDataset::sequence_length, "seq"_a)
      .def(
          "document_range",
          [](const IndexedDataset& d, int64_t k) {
            return py::make_tuple(d.document_first(k), d.document_end(k));
          },
          "doc"_a)
      .def("document_length", &IndexedDataset::document_length, "doc"_a)
      .def("get", &IndexedDataset::get, "seq"_a, "offset"_a = 0, "length"_a = -1, nogil());

  py::class_<IndexedDatasetBuilder>(dm, "IndexedDatasetBuilder")
      .def(py::init<std::string, uint8_t>(), "prefix"_a, "dtype_code"_a)
      .def("add_sequence", &add_sequence, "tokens"_a)
      .def("end_document", &IndexedDatasetBuilder::end_document)
      .def(
          "add_document",
          [](IndexedDatasetBuilder& b, const TokenArray& tokens) {
            add_sequence(b, tokens);
            b.end_document();
          },
          "tokens"_a)
      .def("finalize", &IndexedDatasetBuilder::finalize, nogil())
      .def_property_readonly("num_sequences", &IndexedDatasetBuilder::num_sequences)
      .def_property_readonly("num_documents", &IndexedDatasetBuilder::num_documents)
      .def_static("best_dtype_code", &IndexedDatasetBuilder::best_dtype_code, "vocab_size"_a);

  dm.def("dtype_code_size", &data::dtype_code_size, "code"_a);
  dm.def("dtype_code_name", &data::dtype_code_name, "code"_a);
  dm.def(
      "split_documents",
      [](int64_t n, std::vector<double> ratios) {
        const auto s = data::split_documents(n, std::move(ratios));
        py::list r;
        for (const auto& d : s) r.append(py::make_tuple(d.begin, d.end));
        return r;
      },
      "num_documents"_a, "ratios"_a);

  py::class_<GPTDataset, std::shared_ptr<GPTDataset>>(dm, "GPTDataset")
      .def(py::init([](std::shared_ptr<IndexedDataset> ds, int64_t b, int64_t e, int64_t seq_len,
                       uint64_t seed) {
             py::gil_scoped_release nogil;
             return std::make_shared<GPTDataset>(std::move(ds), b, e, seq_len, seed);
           }),
           "dataset"_a, "doc_begin"_a, "doc_end"_a, "seq_len"_a, "seed"_a)
      .def("__len__", &GPTDataset::samples_per_epoch)
      .def_property_readonly("samples_per_epoch", &GPTDataset::samples_per_epoch)
      .def_property_readonly("seq_len", &GPTDataset::seq_len)
      .def_property_readonly("seed", &GPTDataset::seed)
      .def_property_readonly("doc_begin", &GPTDataset::doc_begin)
      .def_property_readonly("doc_end", &GPTDataset::doc_end)
      .def_property_readonly("tokens_per_epoch", &GPTDataset::tokens_per_epoch)
      .def("sample", py::overload_cast<int64_t>(&GPTDataset::sample, py::const_), "index"_a,
           nogil())
      .def("document_order", &GPTDataset::document_order, "epoch"_a, nogil())
      .def("sample_order", &GPTDataset::sample_order, "epoch"_a, nogil());

  py::class_<DataLoader>(dm, "DataLoader")
      .def(py::init([](std::shared_ptr<GPTDataset> ds, int64_t mb, int64_t rank, int64_t size,
                       int64_t consumed, int prefetch) {
             return std::make_unique<DataLoader>(std::move(ds), mb, rank, size, consumed, prefetch);
           }),
           "dataset"_a, "micro_batch"_a, "dp_rank"_a = 0, "dp_size"_a = 1, "consumed_samples"_a = 0,
           "prefetch"_a = 2)
      .def("next", &DataLoader::next, nogil())
      .def_property_readonly("consumed_samples", &DataLoader::consumed_samples)
      .def_property_readonly("micro_batch", &DataLoader::micro_batch)
      .def_property_readonly("dp_rank", &DataLoader::dp_rank)
      .def_property_readonly("dp_size", &DataLoader::dp_size)
      .def_property_readonly("global_batch", &DataLoader::global_batch);
}

}  // namespace td::python
