// IndexedDataset / IndexedDatasetBuilder: the on-disk bytes against the Megatron format written
// out by hand, round trips for every integer dtype, and a td::Error naming the file for each
// kind of corruption.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/data/indexed_dataset.h"
#include "test_util.h"

namespace fs = std::filesystem;
using td::data::IndexedDataset;
using td::data::IndexedDatasetBuilder;

namespace {

// Raw file bytes, unsigned so that they decode as little-endian integers below.
using Bytes = std::vector<unsigned char>;
using td::test::read_bytes;
using td::test::write_bytes;

template <typename T>
T get_le(const Bytes& b, size_t at) {
  // Little-endian decode by hand (independent of the host's byte order and of the reader).
  uint64_t v = 0;
  for (size_t k = 0; k < sizeof(T); ++k) v |= static_cast<uint64_t>(b.at(at + k)) << (8 * k);
  T r;
  std::memcpy(&r, &v, sizeof(T));
  return r;
}

template <typename T>
void put_le(Bytes& b, size_t at, T value) {
  uint64_t v = 0;
  std::memcpy(&v, &value, sizeof(T));
  for (size_t k = 0; k < sizeof(T); ++k) b.at(at + k) = static_cast<unsigned char>(v >> (8 * k));
}

void add(IndexedDatasetBuilder& b, const std::vector<int64_t>& seq) {
  b.add_sequence(seq.data(), static_cast<int64_t>(seq.size()));
}

std::vector<int64_t> tokens(const IndexedDataset& ds, int64_t seq) {
  const td::Tensor t = ds.get(seq);
  const int64_t* p = t.data_ptr<int64_t>();
  return {p, p + t.numel()};
}

// Expects `f` to throw a td::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected td::Error containing '" << parts.at(0) << "'";
  } catch (const td::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << msg << "\n  lacks: " << p;
  }
}

// The reference dataset of the byte-level tests: 3 documents, 4 sequences (one empty), uint16.
//   doc 0: [1, 2, 3], [4]    doc 1: [65535, 0]    doc 2: []
void write_reference(const std::string& prefix) {
  IndexedDatasetBuilder b(prefix, td::data::kDTypeUInt16);
  add(b, {1, 2, 3});
  add(b, {4});
  b.end_document();
  add(b, {65535, 0});
  b.end_document();
  add(b, {});
  b.end_document();
  b.finalize();
}

}  // namespace

// The .idx/.bin bytes follow Megatron's layout exactly (parsed here by hand, not by the reader).
TEST(IndexedDataset, WritesMegatronBytes) {
  td::test::TempDir dir;
  const std::string p = dir.path("ref");
  write_reference(p);
  const auto idx = read_bytes<Bytes>(p + ".idx");
  ASSERT_EQ(idx.size(), 34u + 4 * 4 + 8 * 4 + 8 * 4);
  const unsigned char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  EXPECT_EQ(std::memcmp(idx.data(), magic, 9), 0);
  EXPECT_EQ(get_le<uint64_t>(idx, 9), 1u);   // version
  EXPECT_EQ(idx[17], 8);                     // uint16
  EXPECT_EQ(get_le<uint64_t>(idx, 18), 4u);  // sequence_count
  EXPECT_EQ(get_le<uint64_t>(idx, 26), 4u);  // document_count = len(document_indices)
  const int32_t lengths[4] = {3, 1, 2, 0};
  const int64_t pointers[4] = {0, 6, 8, 12};
  const int64_t doc_idx[4] = {0, 2, 3, 4};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(get_le<int32_t>(idx, 34 + 4 * i), lengths[i]) << i;
    EXPECT_EQ(get_le<int64_t>(idx, 50 + 8 * i), pointers[i]) << i;
    EXPECT_EQ(get_le<int64_t>(idx, 82 + 8 * i), doc_idx[i]) << i;
  }
  const auto bin = read_bytes<Bytes>(p + ".bin");
  const uint16_t values[6] = {1, 2, 3, 4, 65535, 0};
  ASSERT_EQ(bin.size(), 12u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(get_le<uint16_t>(bin, 2 * i), values[i]) << i;
  // Nothing temporary is left behind.
  EXPECT_FALSE(fs::exists(p + ".bin.tmp"));
  EXPECT_FALSE(fs::exists(p + ".idx.tmp"));
}

// The reader returns what the builder wrote: counts, lengths, document ranges, token slices.
TEST(IndexedDataset, ReadsBack) {
  td::test::TempDir dir;
  const std::string p = dir.path("ref");
  write_reference(p);
  const IndexedDataset ds(p);
  EXPECT_EQ(ds.num_sequences(), 4);
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.num_tokens(), 6);
  EXPECT_EQ(ds.token_dtype_code(), td::data::kDTypeUInt16);
  EXPECT_EQ(tokens(ds, 0), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(tokens(ds, 1), (std::vector<int64_t>{4}));
  EXPECT_EQ(tokens(ds, 2), (std::vector<int64_t>{65535, 0}));  // uint16 max is not sign-extended
  EXPECT_EQ(tokens(ds, 3), (std::vector<int64_t>{}));
  EXPECT_EQ(ds.document_first(0), 0);
  EXPECT_EQ(ds.document_end(0), 2);
  EXPECT_EQ(ds.document_first(2), 3);
  EXPECT_EQ(ds.document_end(2), 4);
  EXPECT_EQ(ds.document_length(0), 4);
  EXPECT_EQ(ds.document_length(2), 0);
  int64_t out[2] = {-1, -1};
  ds.read(0, 1, 2, out);
  EXPECT_EQ(out[0], 2);
  EXPECT_EQ(out[1], 3);
  const td::Tensor t = ds.get(0, 1, 1);
  EXPECT_EQ(t.dtype(), td::DType::Int64);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.data_ptr<int64_t>()[0], 2);
  // Bounds are checked.
  expect_error([&] { ds.read(0, 2, 2, out); }, {"out of range", "sequence 0 of length 3"});
  expect_error([&] { ds.read(4, 0, 0, out); }, {"sequence 4 out of range"});
  expect_error([&] { ds.read(-1, 0, 0, out); }, {"out of range"});
  expect_error([&] { (void)ds.document_first(3); }, {"document 3 out of range"});
}

// Every integer dtype keeps its extreme values through a write and a read.
TEST(IndexedDataset, RoundTripsEveryIntegerDtype) {
  td::test::TempDir dir;
  struct Case {
    uint8_t code;
    int64_t lo, hi;
  };
  const Case cases[] = {
      {td::data::kDTypeUInt8, 0, 255},
      {td::data::kDTypeInt8, -128, 127},
      {td::data::kDTypeInt16, -32768, 32767},
      {td::data::kDTypeInt32, std::numeric_limits<int32_t>::min(),
       std::numeric_limits<int32_t>::max()},
      {td::data::kDTypeInt64, std::numeric_limits<int64_t>::min(),
       std::numeric_limits<int64_t>::max()},
      {td::data::kDTypeUInt16, 0, 65535},
  };
  for (const auto& c : cases) {
    const std::string p = dir.path(std::string("d").append(std::to_string(c.code)));
    const std::vector<int64_t> seq = {c.lo, c.hi, 0, 1, c.hi - 1};
    {
      IndexedDatasetBuilder b(p, c.code);
      add(b, seq);
      b.end_document();
      b.finalize();
    }
    EXPECT_EQ(fs::file_size(p + ".bin"), seq.size() * td::data::dtype_code_size(c.code));
    const IndexedDataset ds(p);
    EXPECT_EQ(ds.token_dtype_code(), c.code);
    EXPECT_EQ(tokens(ds, 0), seq) << td::data::dtype_code_name(c.code);
  }
}

// A value that does not fit the dtype is rejected by name, and nothing of it is written.
TEST(IndexedDataset, BuilderRejectsOverflow) {
  td::test::TempDir dir;
  IndexedDatasetBuilder b(dir.path("o"), td::data::kDTypeUInt16);
  const std::vector<int64_t> big = {1, 65536};
  const std::vector<int64_t> neg = {-1};
  expect_error([&] { b.add_sequence(big.data(), 2); }, {"token 65536", "position 1", "uint16"});
  expect_error([&] { b.add_sequence(neg.data(), 1); }, {"token -1", "uint16"});
  EXPECT_EQ(b.num_sequences(), 0);
  IndexedDatasetBuilder b8(dir.path("o8"), td::data::kDTypeInt8);
  const std::vector<int64_t> v128 = {128};
  expect_error([&] { b8.add_sequence(v128.data(), 1); }, {"token 128", "int8"});
  // Float codes and unknown codes are not token dtypes.
  expect_error([&] { IndexedDatasetBuilder(dir.path("f"), td::data::kDTypeFloat32); },
               {"float32", "not an integer"});
  expect_error([&] { IndexedDatasetBuilder(dir.path("f"), 9); }, {"dtype code 9"});
}

// Megatron's DType.optimal_dtype rule.
TEST(IndexedDataset, BestDtypeCode) {
  EXPECT_EQ(IndexedDatasetBuilder::best_dtype_code(50257), td::data::kDTypeUInt16);
  EXPECT_EQ(IndexedDatasetBuilder::best_dtype_code(65499), td::data::kDTypeUInt16);
  EXPECT_EQ(IndexedDatasetBuilder::best_dtype_code(65500), td::data::kDTypeInt32);
  EXPECT_EQ(IndexedDatasetBuilder::best_dtype_code(128256), td::data::kDTypeInt32);
}

// A builder that is never finalized leaves existing destination files untouched and removes its
// temporaries; finalize closes a trailing unfinished document; a second finalize is an error.
TEST(IndexedDataset, BuilderIsAtomic) {
  td::test::TempDir dir;
  const std::string p = dir.path("a");
  write_reference(p);
  const auto idx0 = read_bytes<Bytes>(p + ".idx"), bin0 = read_bytes<Bytes>(p + ".bin");
  {
    IndexedDatasetBuilder b(p, td::data::kDTypeInt32);
    add(b, {7, 8, 9});
    b.end_document();
  }  // abandoned
  EXPECT_EQ(read_bytes<Bytes>(p + ".idx"), idx0);
  EXPECT_EQ(read_bytes<Bytes>(p + ".bin"), bin0);
  EXPECT_FALSE(fs::exists(p + ".bin.tmp"));

  IndexedDatasetBuilder b(p, td::data::kDTypeInt32);
  add(b, {7, 8, 9});
  b.end_document();
  add(b, {10});  // no end_document(): finalize closes it
  b.finalize();
  expect_error([&] { b.finalize(); }, {"already finalized"});
  const IndexedDataset ds(p);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.token_dtype_code(), td::data::kDTypeInt32);
  EXPECT_EQ(tokens(ds, 1), (std::vector<int64_t>{10}));
}

// An empty dataset (no sequences, document_indices = [0]) is valid.
TEST(IndexedDataset, EmptyDataset) {
  td::test::TempDir dir;
  const std::string p = dir.path("e");
  IndexedDatasetBuilder(p, td::data::kDTypeUInt16).finalize();
  const IndexedDataset ds(p);
  EXPECT_EQ(ds.num_sequences(), 0);
  EXPECT_EQ(ds.num_documents(), 0);
  EXPECT_EQ(ds.num_tokens(), 0);
}

// Each corruption is caught at open with a td::Error that names the .idx file and the problem.
TEST(IndexedDataset, RejectsCorruptFiles) {
  td::test::TempDir dir;
  const std::string good = dir.path("good");
  write_reference(good);
  const auto idx = read_bytes<Bytes>(good + ".idx"), bin = read_bytes<Bytes>(good + ".bin");
  int n = 0;
  // Writes a (possibly modified) copy and expects opening it to fail with `parts`.
  auto check = [&](const Bytes& i, const Bytes& b, std::vector<std::string> parts) {
    const std::string p = dir.path("bad" + std::to_string(n++));
    write_bytes(p + ".idx", i);
    write_bytes(p + ".bin", b);
    parts.push_back(p + ".idx");
    expect_error([&] { IndexedDataset ds(p); }, parts);
  };
  {  // truncated .bin: the last sequence (2 tokens at byte 8) ends past the end
    auto b = bin;
    b.resize(10);
    check(idx, b, {"sequence 2 ends at byte 12", "bad0.bin has 10 bytes", "truncated .bin"});
  }
  {  // trailing bytes in .bin
    auto b = bin;
    b.push_back(0);
    check(idx, b, {"end at byte 12", "13 bytes"});
  }
  {
    auto i = idx;
    i[3] = 'X';
    check(i, bin, {"bad magic"});
  }
  {
    auto i = idx;
    put_le<uint64_t>(i, 9, 2);
    check(i, bin, {"version 2"});
  }
  {
    auto i = idx;
    i[17] = 9;
    check(i, bin, {"bad dtype code 9"});
  }
  {
    auto i = idx;
    i[17] = 0;
    check(i, bin, {"bad dtype code 0"});
  }
  {  // pointer of sequence 1 inconsistent with length 3 * 2 bytes of sequence 0
    auto i = idx;
    put_le<int64_t>(i, 50 + 8, 4);
    check(i, bin, {"sequence 1 starts at byte 4", "end at byte 6", "inconsistent"});
  }
  {  // dtype code changed to int32: the same pointers no longer match 4-byte items
    auto i = idx;
    i[17] = 4;
    check(i, bin, {"sequence 1 starts at byte 6", "end at byte 12"});
  }
  {
    auto i = idx;
    put_le<int32_t>(i, 34 + 4, -1);
    check(i, bin, {"sequence 1 has negative length -1"});
  }
  {  // truncated .idx
    auto i = idx;
    i.resize(i.size() - 8);
    check(i, bin, {"4 sequences and 4 document indices", "truncated .idx"});
  }
  {  // shorter than the header
    auto i = idx;
    i.resize(20);
    check(i, bin, {"20 bytes", "header"});
  }
  {  // a huge count must not overflow the size arithmetic
    auto i = idx;
    put_le<uint64_t>(i, 18, std::numeric_limits<uint64_t>::max() / 4);
    check(i, bin, {"truncated .idx"});
  }
  {  // document indices decreasing
    auto i = idx;
    put_le<int64_t>(i, 82 + 8 * 2, 1);
    check(i, bin, {"document_indices[2] = 1", "non-decreasing"});
  }
  {  // last document index != sequence count
    auto i = idx;
    put_le<int64_t>(i, 82 + 8 * 3, 3);
    check(i, bin, {"last document index is 3", "4 sequences"});
  }
  {  // first document index != 0
    auto i = idx;
    put_le<int64_t>(i, 82, 1);
    check(i, bin, {"document_indices[0] is 1"});
  }
  // Missing files name the path.
  expect_error([&] { IndexedDataset ds(dir.path("missing")); },
               {"cannot open", dir.path("missing") + ".idx"});
  fs::remove(dir.path("good") + ".bin");
  expect_error([&] { IndexedDataset ds(good); }, {"cannot open", good + ".bin"});
}

// A float dataset (Megatron allows them for other uses) opens, but token reads refuse it.
TEST(IndexedDataset, FloatTokensRejectedOnRead) {
  td::test::TempDir dir;
  const std::string p = dir.path("f");
  write_reference(p);
  auto idx = read_bytes<Bytes>(p + ".idx");
  auto bin = read_bytes<Bytes>(p + ".bin");
  idx[17] = td::data::kDTypeFloat32;  // 4-byte items: rewrite pointers for lengths 3,1,2,0
  put_le<int64_t>(idx, 50 + 8, 12);
  put_le<int64_t>(idx, 50 + 16, 16);
  put_le<int64_t>(idx, 50 + 24, 24);
  bin.resize(24);
  write_bytes(p + ".idx", idx);
  write_bytes(p + ".bin", bin);
  const IndexedDataset ds(p);
  EXPECT_EQ(ds.token_dtype_code(), td::data::kDTypeFloat32);
  int64_t out[3];
  expect_error([&] { ds.read(0, 0, 3, out); }, {"float32", "not an integer dtype"});
}

// Megatron's multimodal indexes carry one int8 mode per sequence after document_indices; the
// reader accepts (and ignores) them.
TEST(IndexedDataset, AcceptsMultimodalModes) {
  td::test::TempDir dir;
  const std::string p = dir.path("m");
  write_reference(p);
  auto idx = read_bytes<Bytes>(p + ".idx");
  idx.insert(idx.end(), {0, 1, 0, 1});
  write_bytes(p + ".idx", idx);
  const IndexedDataset ds(p);
  EXPECT_EQ(tokens(ds, 2), (std::vector<int64_t>{65535, 0}));
}
